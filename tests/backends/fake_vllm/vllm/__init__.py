"""Stand-in vLLM package for the launcher tests (see api_server.py)."""
