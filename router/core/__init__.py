"""The core every layer shares: types, errors, config, the profile format, ASGI types and the table of paths.

It imports nothing else of ours (tests/test_layers.py holds it to that).
"""
