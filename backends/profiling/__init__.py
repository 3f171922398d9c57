"""`chimera profile`: measure a live worker and fit the step-time profile the simulator and the predictor read.

A tool outside serving, like the bench: nothing the gateway runs imports it.

- :mod:`backends.profiling.probe` times a live OpenAI-compatible worker (vLLM, or `chimera sim`);
- :mod:`backends.profiling.fit` turns the probe's points into a profile (``router/core/profile.py``'s format);
- :mod:`backends.profiling.replay` replays a burst through the simulator's engine (the fit's last stage);
- :mod:`backends.profiling.command` is the command: its flags, the files it reads and writes.
"""
