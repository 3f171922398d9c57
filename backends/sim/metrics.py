"""Prometheus exposition of the simulator's state with vLLM's metric names.

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
    def __init__(self, engine: Engine, model_name: str) -> None:
        self._engine = engine
        self._model = model_name

    def collect(self) -> Iterator[Metric]:
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
        yield gauge("sim:engine_lag_seconds", "Lateness of the latest engine step against its schedule.", s.last_lag)
        yield hist("sim:engine_step_lag_seconds", "Lateness of engine steps against their schedule.", s.lag)
        yield counter("sim:engine_steps", "Engine steps run.", s.steps)
        yield counter("sim:engine_busy_seconds", "Simulated GPU time of the steps run (wall seconds).", s.busy_s)


def make_registry(engine: Engine, model_name: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model_name))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
