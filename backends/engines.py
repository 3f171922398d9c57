"""Each inference server's own metrics, mapped to the fleet view: requests running, requests waiting, KV use (0..1).

Every engine below speaks OpenAI's API, so the gateway routes to all of them alike; what differs is how each says
how loaded it is. The names come from each engine's source (the versions read are named), so a worker is read in
its own terms, never guessed from vLLM's:

- vllm: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (0..1);
- sglang: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage`` (0..1);
- tgi: ``tgi_batch_current_size``, ``tgi_queue_size``, ``tgi_batch_current_max_tokens`` over
  ``tgi_batch_max_total_tokens``;
- trtllm: ``trtllm_num_requests_running``, ``trtllm_num_requests_waiting``, ``trtllm_kv_cache_utilization`` (0..1);
- lightllm: ``lightllm_num_running_reqs``, ``lightllm_queue_size``, and ``current_load`` of ``GET /token_load``.

Where each comes from:

- **vLLM** 0.26 (``vllm/v1/metrics/loggers.py``): ``vllm:gpu_cache_usage_perc`` before the V1 engine.
- **SGLang** 0.5.23 (``python/sglang/srt/observability/metrics_collector.py``; metrics need ``--enable-metrics``).
  With priority scheduling each gauge also has one sample per ``priority`` label besides the total
  (``priority=""``): only the total is read. ``token_usage`` is the fullest of its KV pools.
- **TGI** 3.3 (``backends/v3/src/backend.rs``, ``queue.rs``, ``lib.rs``): no KV gauge; the batch's reserved token
  ceiling over the KV capacity set at warm-up is the nearest, an upper bound on what the batch holds.
- **TensorRT-LLM** ``trtllm-serve`` (``tensorrt_llm/metrics/collector.py``): Prometheus at ``/prometheus/metrics``,
  served with ``return_perf_metrics: true`` in its config; its gauges move when requests finish.
- **LightLLM** 1.2 (``lightllm/server/router/manager.py``, ``api_http.py``): ``lightllm_batch_current_size`` (the
  same count) before 1.2; KV use is not in its Prometheus text but in its ``/token_load`` JSON.

A worker whose ``engine:`` is not configured is read by the names its ``/metrics`` carries (:func:`detect`).
"""

from __future__ import annotations

from dataclasses import dataclass

from router.core.types import ENGINES, Engine


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """Where and by which names one engine reports its load. Each field lists the sample names to try in order;
    the first one present is read (summed over its label sets)."""

    engine: Engine
    metrics_path: str
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_fraction: tuple[str, ...] = ()  # 0..1, averaged over label sets
    kv_used_tokens: str | None = None  # with kv_capacity_tokens: used / capacity where no fraction is exported
    kv_capacity_tokens: str | None = None
    kv_json: tuple[str, str] | None = None  # (path, key): KV use as a JSON number (or a list, one per DP rank)
    preemptions: tuple[str, ...] = ()  # counters, with or without ``_total``
    prefix_queries: tuple[str, ...] = ()
    prefix_hits: tuple[str, ...] = ()
    skip_labels: tuple[tuple[str, str], ...] = ()  # samples with such a label but another value are not counted

    @property
    def marker(self) -> str:
        """A sample name only this engine exposes: how :func:`detect` tells it."""
        return self.running[0]


VLLM = EngineMetrics(
    "vllm", "/metrics", ("vllm:num_requests_running",), ("vllm:num_requests_waiting",),
    kv_fraction=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), preemptions=("vllm:num_preemptions",),
    prefix_queries=("vllm:prefix_cache_queries",), prefix_hits=("vllm:prefix_cache_hits",),
)  # fmt: skip
SGLANG = EngineMetrics(
    "sglang", "/metrics", ("sglang:num_running_reqs",), ("sglang:num_queue_reqs",), kv_fraction=("sglang:token_usage",),
    kv_used_tokens="sglang:num_used_tokens", kv_capacity_tokens="sglang:max_total_num_tokens",
    skip_labels=(("priority", ""),),
)  # fmt: skip
TGI = EngineMetrics(
    "tgi", "/metrics", ("tgi_batch_current_size",), ("tgi_queue_size",),
    kv_used_tokens="tgi_batch_current_max_tokens", kv_capacity_tokens="tgi_batch_max_total_tokens",
)  # fmt: skip
TRTLLM = EngineMetrics(
    "trtllm", "/prometheus/metrics", ("trtllm_num_requests_running",), ("trtllm_num_requests_waiting",),
    kv_fraction=("trtllm_kv_cache_utilization",),
)  # fmt: skip
LIGHTLLM = EngineMetrics(
    "lightllm", "/metrics", ("lightllm_num_running_reqs", "lightllm_batch_current_size"), ("lightllm_queue_size",),
    kv_json=("/token_load", "current_load"),
)  # fmt: skip

BY_ENGINE: dict[str, EngineMetrics] = {m.engine: m for m in (VLLM, SGLANG, TGI, TRTLLM, LIGHTLLM)}
assert tuple(BY_ENGINE) == ENGINES


def detect(text: str) -> EngineMetrics | None:
    """The engine whose load metrics ``text`` (a ``/metrics`` body) carries; None for none of them."""
    for m in BY_ENGINE.values():
        if any(name in text for name in m.running):
            return m
    return None


def json_load(value: object) -> float | None:
    """A ``kv_json`` value as one fraction: a number, or the mean of a list of them (one per DP rank)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list) and value and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        return sum(float(v) for v in value) / len(value)
    return None
