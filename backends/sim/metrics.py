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


class EngineCollector(Collector):
    def __init__(self, engine: Engine, model_name: str, flavour: str = "vllm") -> None:
        self._engine = engine
        self._model = model_name
        self._flavour = flavour

    def collect(self) -> Iterator[Metric]:
        if self._flavour != "vllm":
            yield from OTHERS[self._flavour](self._engine, self._model)
            yield from _sim_metrics(self._engine, ["model_name"], [self._model])
            return
        e, labels, model = self._engine, ["model_name"], [self._model]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(model, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(model, value)
            return c

        def hist(name: str, doc: str, h: Hist) -> HistogramMetricFamily:
            m = HistogramMetricFamily(name, doc, labels=labels)
            m.add_metric(model, h.buckets(), h.sum)
            return m

        s = e.stats
        yield gauge("vllm:num_requests_running", "Requests in model execution batches.", len(e.running))
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", len(e.waiting))
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv.usage)
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching", "model_name"],
        )
        info.add_metric([str(e.kv.block_size), str(e.kv.num_blocks), "True", self._model], 1.0)
        yield info
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.preemptions)
        yield counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", s.prefix_queries
        )
        yield counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", s.prefix_hits
        )
        yield counter("vllm:request_success", "Count of successfully processed requests.", s.finished)
        yield hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft)
        yield hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", s.e2e)
        yield hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", s.itl)
        yield hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase.", s.queue)
        yield hist(
            "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", s.prefill
        )
        yield from _sim_metrics(e, labels, model)


def _sim_metrics(e: Engine, labels: list[str], values: list[str]) -> Iterator[Metric]:
    """The simulator's own (``sim:``), which no engine has and the prober never reads."""
    s = e.stats
    lag = GaugeMetricFamily("sim:engine_lag_seconds", "Lateness of the latest engine step against its schedule.",
                            labels=labels)  # fmt: skip
    lag.add_metric(values, s.last_lag)
    yield lag
    lags = HistogramMetricFamily("sim:engine_step_lag_seconds", "Lateness of engine steps against their schedule.",
                                 labels=labels)  # fmt: skip
    lags.add_metric(values, s.lag.buckets(), s.lag.sum)
    yield lags
    busy = "Simulated GPU time of the steps run (wall seconds)."
    for name, doc, value in (("sim:engine_steps", "Engine steps run.", s.steps),
                             ("sim:engine_busy_seconds", busy, s.busy_s)):  # fmt: skip
        c = CounterMetricFamily(name, doc, labels=labels)
        c.add_metric(values, value)
        yield c


def _gauges(rows: list[tuple[str, str, float]], labels: list[str], values: list[str]) -> Iterator[Metric]:
    for name, doc, value in rows:
        g = GaugeMetricFamily(name, doc, labels=labels)
        g.add_metric(values, value)
        yield g


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
    for name, doc, value in (("sglang:prompt_tokens", "Number of prefill tokens processed.", e.stats.prompt_tokens),
                             ("sglang:generation_tokens", "Number of generation tokens processed.",
                              e.stats.generation_tokens),
                             ("sglang:num_requests", "Number of requests processed.", e.stats.finished)):  # fmt: skip
        c = CounterMetricFamily(name, doc, labels=labels[:2])
        c.add_metric(values[:2], value)
        yield c
    h = HistogramMetricFamily("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels=labels[:2])  # fmt: skip
    h.add_metric(values[:2], e.stats.ttft.buckets(), e.stats.ttft.sum)
    yield h


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
    c = CounterMetricFamily("tgi_request_success", "Number of successful requests")
    c.add_metric([], e.stats.finished)
    yield c


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


OTHERS = {"sglang": _sglang, "tgi": _tgi, "trtllm": _trtllm, "lightllm": _lightllm}


def make_registry(engine: Engine, model_name: str, flavour: str = "vllm") -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model_name, flavour))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
