"""A zero-latency OpenAI-style worker on 127.0.0.1:18001 (scripts/bench_state.py's worker_app)."""

import pathlib
import sys

import uvicorn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench_state import worker_app

uvicorn.run(worker_app(0.0), host="127.0.0.1", port=18001, log_level="warning", access_log=False)
