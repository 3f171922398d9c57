"""What the simulated worker answers besides the OpenAI routes when it plays another engine (``chimera sim
--engine``): that engine's metrics path, health and identity endpoints, as each engine's own server has them.

- **vllm**: ``/metrics``, ``/health``, ``/version`` (``{"version": ...}``).
- **sglang** (0.5.23, ``srt/entrypoints/http_server.py``): ``/metrics``; ``/health`` and ``/health_generate``;
  ``/server_info`` (alias ``/get_server_info``) with its ``version`` and ``max_total_num_tokens``; ``/model_info``
  (alias ``/get_model_info``); no ``/version``.
- **tgi** (3.3, ``router/src/server.rs``): ``/metrics``, ``/health``, ``/info`` (``router``:
  ``"text-generation-router"``, ``model_id``, ``version``, ``max_total_tokens``); no ``/version``.
- **trtllm** (``tensorrt_llm/serve/openai_server.py``): Prometheus at ``/prometheus/metrics``; ``/metrics`` is a
  JSON list of iteration stats (``numActiveRequests``, ``numQueuedRequests``, ``kvCacheStats``); ``/health``,
  ``/health_generate``, ``/version``.
- **lightllm** (1.2, ``lightllm/server/api_http.py``): ``/metrics``; ``/health`` and ``/healthz`` answer
  ``{"message": "Ok"}``; ``/token_load`` (``current_load``: KV use, 0..1); ``/get_model_name``; no ``/version``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from backends.sim.engine import Engine

#: where each engine serves its Prometheus text
METRICS_PATH = {"vllm": "/metrics", "sglang": "/metrics", "tgi": "/metrics", "trtllm": "/prometheus/metrics",
                "lightllm": "/metrics"}  # fmt: skip
#: ``owned_by`` on each engine's ``/v1/models`` cards (TGI: the model's id)
OWNED_BY = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm", "lightllm": "lightllm"}
VERSIONS = {"vllm": "0.26.0+sim", "sglang": "0.5.23+sim", "tgi": "3.3.6+sim", "trtllm": "1.2.0+sim",
            "lightllm": "1.2.0+sim"}  # fmt: skip
HEALTH_PATHS = {"vllm": ("/health",), "sglang": ("/health", "/health_generate"), "tgi": ("/health",),
                "trtllm": ("/health", "/health_generate"), "lightllm": ("/health", "/healthz")}  # fmt: skip
OK_BODY = {"lightllm": b'{"message":"Ok"}'}


def identity(flavour: str, path: str, engine: Engine, model: str, max_model_len: int) -> Any:
    """The JSON a ``GET path`` gets from ``flavour``'s server, where it is one of its identity or load endpoints
    (``/version``, ``/info``, ``/server_info``, ``/token_load``...); None for any other path."""
    version = VERSIONS[flavour]
    if path == "/version" and flavour in ("vllm", "trtllm"):
        return {"version": version}
    if flavour == "sglang":
        if path in ("/server_info", "/get_server_info"):
            return {"version": version, "served_model_name": model, "context_length": max_model_len,
                    "max_total_num_tokens": engine.capacity_tokens, "frontend": "python"}  # fmt: skip
        if path in ("/model_info", "/get_model_info"):
            return {"model_path": model, "served_model_name": model, "is_generation": True}
    if flavour == "tgi" and path == "/info":
        return {"model_id": model, "model_sha": None, "max_total_tokens": max_model_len, "version": version,
                "router": "text-generation-router", "max_concurrent_requests": 128}  # fmt: skip
    if flavour == "lightllm":
        if path == "/token_load":
            return {"current_load": engine.kv.usage, "logical_max_load": engine.kv.usage, "dynamic_max_load": 0.0}
        if path == "/get_model_name":
            return {"model_name": model}
    if flavour == "trtllm" and path == "/metrics":  # the iteration stats since the last call
        return iteration_stats(engine)
    return None


def iteration_stats(engine: Engine) -> list[dict[str, Any]]:
    """TensorRT-LLM's ``/metrics``: one iteration's stats (its C++ ``IterationStats``, as JSON)."""
    blocks, used = engine.kv.num_blocks, round(engine.kv.usage * engine.kv.num_blocks)
    kv = {"maxNumBlocks": blocks, "freeNumBlocks": blocks - used, "usedNumBlocks": used,
          "tokensPerBlock": engine.kv.block_size}  # fmt: skip
    return [{"iter": engine.stats.steps, "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
             "numActiveRequests": len(engine.running), "numQueuedRequests": len(engine.waiting),
             "maxNumActiveRequests": engine.max_num_seqs, "kvCacheStats": kv}]  # fmt: skip


def dumps(data: Any) -> bytes:
    return json.dumps(data).encode()
