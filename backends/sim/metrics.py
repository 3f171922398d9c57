"""Prometheus exposition of the simulator's state with vLLM's metric names, or another engine's
(``chimera sim --engine``: SGLang's, TGI's, TensorRT-LLM's or LightLLM's load gauges, and only those, with the
names, units and labels of each engine's own source; docs/simulator.md).

Hot-path observations go into :class:`Hist` (a bisect and two additions, no lock: everything runs
on the event loop); a collector turns them and the engine's counters into metric families when
``/metrics`` is scraped, so an idle scrape costs nothing per token.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from backends.sim.engine import Engine
from backends.sim.hist import Hist


def _gauge(name: str, doc: str, labels: list[str], values: list[str], value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=labels)
    g.add_metric(values, value)
    return g


def _counter(name: str, doc: str, labels: list[str], values: list[str], value: float) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=labels)
    c.add_metric(values, value)
    return c


def _hist(name: str, doc: str, labels: list[str], values: list[str], h: Hist) -> HistogramMetricFamily:
    m = HistogramMetricFamily(name, doc, labels=labels)
    m.add_metric(values, h.buckets(), h.sum)
    return m


class EngineCollector(Collector):
    def __init__(self, engine: Engine, model_name: str, flavour: str = "vllm") -> None:
        self._engine = engine
        self._model = model_name
        self._flavour = flavour

    def collect(self) -> Iterator[Metric]:
        e, labels, model = self._engine, ["model_name"], [self._model]
        yield from FLAVOURS[self._flavour](e, self._model)
        yield from _sim_metrics(e, labels, model)


def _vllm(e: Engine, name: str) -> Iterator[Metric]:
    """vLLM's names and buckets (label ``model_name``)."""
    labels, model = ["model_name"], [name]

    def gauge(metric: str, doc: str, value: float) -> GaugeMetricFamily:
        return _gauge(metric, doc, labels, model, value)

    def counter(metric: str, doc: str, value: float) -> CounterMetricFamily:
        return _counter(metric, doc, labels, model, value)

    def hist(metric: str, doc: str, h: Hist) -> HistogramMetricFamily:
        return _hist(metric, doc, labels, model, h)

    s = e.stats
    yield gauge("vllm:num_requests_running", "Requests in model execution batches.", len(e.running))
    yield gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", len(e.waiting))
    yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv.usage)
    yield _gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                 ["block_size", "num_gpu_blocks", "enable_prefix_caching", "model_name"],
                 [str(e.kv.block_size), str(e.kv.num_blocks), "True", name], 1.0)  # fmt: skip
    yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens)
    yield counter("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens)
    yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.preemptions)
    yield counter(
        "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", s.prefix_queries
    )
    yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", s.prefix_hits)
    yield counter("vllm:request_success", "Count of successfully processed requests.", s.finished)
    yield hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft)
    yield hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", s.e2e)
    yield hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl)
    yield hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase.", s.queue)
    yield hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", s.prefill)


def _sim_metrics(e: Engine, labels: list[str], values: list[str]) -> Iterator[Metric]:
    """The simulator's own (``sim:``), which no engine has and the prober never reads."""
    s = e.stats
    yield _gauge("sim:engine_lag_seconds", "Lateness of the latest engine step against its schedule.", labels, values,
                 s.last_lag)  # fmt: skip
    yield _hist("sim:engine_step_lag_seconds", "Lateness of engine steps against their schedule.", labels, values,
                s.lag)  # fmt: skip
    yield _counter("sim:engine_steps", "Engine steps run.", labels, values, s.steps)
    yield _counter("sim:engine_busy_seconds", "Simulated GPU time of the steps run (wall seconds).", labels, values,
                   s.busy_s)  # fmt: skip


def _gauges(rows: list[tuple[str, str, float]], labels: list[str], values: list[str]) -> Iterator[Metric]:
    for name, doc, value in rows:
        yield _gauge(name, doc, labels, values, value)


def _sglang(e: Engine, model: str) -> Iterator[Metric]:
    """SGLang 0.5.23's scheduler gauges (``srt/observability/metrics_collector.py``), one TP rank's."""
    labels, values = ["model_name", "engine_type", "tp_rank", "pp_rank"], [model, "unified", "0", "0"]
    used = round(e.kv.usage * e.capacity_tokens)
    yield from _gauges([
        ("sglang:num_running_reqs", "The number of running requests.", len(e.running)),
        ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", len(e.waiting)),
        ("sglang:token_usage", "The token usage.", e.kv.usage),
        ("sglang:num_used_tokens", "The number of used tokens.", used),
        ("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", e.capacity_tokens),
    ], labels, values)  # fmt: skip
    s, kind = e.stats, (labels[:2], values[:2])
    yield _counter("sglang:prompt_tokens", "Number of prefill tokens processed.", *kind, s.prompt_tokens)
    yield _counter("sglang:generation_tokens", "Number of generation tokens processed.", *kind, s.generation_tokens)
    yield _counter("sglang:num_requests", "Number of requests processed.", *kind, s.finished)
    yield _hist("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", *kind, s.ttft)


def _tgi(e: Engine, model: str) -> Iterator[Metric]:
    """TGI 3.3's router gauges (``backends/v3/src/backend.rs``, ``queue.rs``, ``lib.rs``): no labels. The batch's
    token ceiling is what its requests may grow to (prompts and ``max_new_tokens``); here their final lengths."""
    reserved = sum(r.prompt_len + r.final_len for r in e.running)
    yield from _gauges([
        ("tgi_batch_current_size", "Current batch size", len(e.running)),
        ("tgi_queue_size", "Current queue size", len(e.waiting)),
        ("tgi_batch_current_max_tokens", "Maximum tokens for the current batch", min(reserved, e.capacity_tokens)),
        ("tgi_batch_max_total_tokens", "Maximum amount of tokens in total.", e.capacity_tokens),
    ], [], [])  # fmt: skip
    yield _counter("tgi_request_success", "Number of successful requests", [], [], e.stats.finished)


def _trtllm(e: Engine, model: str) -> Iterator[Metric]:
    """``trtllm-serve``'s load gauges (``tensorrt_llm/metrics/collector.py``), at ``/prometheus/metrics``."""
    labels, values = ["model_name", "engine_type"], [model, "pytorch"]
    blocks = e.kv.num_blocks
    used = round(e.kv.usage * blocks)
    yield from _gauges([
        ("trtllm_num_requests_running", "Number of requests currently running.", len(e.running)),
        ("trtllm_num_requests_waiting", "Number of requests waiting to be scheduled.", len(e.waiting)),
        ("trtllm_kv_cache_utilization", "KV cache utilization (used / max blocks).", e.kv.usage),
        ("trtllm_kv_cache_used_blocks", "KV cache used blocks.", used),
        ("trtllm_kv_cache_free_blocks", "KV cache free blocks.", blocks - used),
        ("trtllm_kv_cache_max_blocks", "KV cache max blocks.", blocks),
        ("trtllm_kv_cache_tokens_per_block", "KV cache tokens per block.", e.kv.block_size),
    ], labels, values)  # fmt: skip


def _lightllm(e: Engine, model: str) -> Iterator[Metric]:
    """LightLLM 1.2's router gauges (``lightllm/server/router/manager.py``); its KV use is ``/token_load``'s."""
    yield from _gauges([
        ("lightllm_batch_current_size", "The current batch size", len(e.running)),
        ("lightllm_num_running_reqs", "The number of running requests", len(e.running)),
        ("lightllm_batch_pause_size", "The number of paused requests", 0),
        ("lightllm_queue_size", "The number of waiting requests", len(e.waiting)),
    ], ["model_name"], [model])  # fmt: skip


FLAVOURS = {"vllm": _vllm, "sglang": _sglang, "tgi": _tgi, "trtllm": _trtllm, "lightllm": _lightllm}


def make_registry(engine: Engine, model_name: str, flavour: str = "vllm") -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model_name, flavour))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
