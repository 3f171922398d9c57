"""Prometheus exposition of the simulator's state with vLLM's metric names.

Hot-path observations go into :class:`Hist` (a bisect and two additions, no lock: everything runs
on the event loop); a collector turns them and the engine's counters into metric families when
``/metrics`` is scraped, so an idle scrape costs nothing per token.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from backends.sim.engine import Engine

# Bucket bounds as vLLM 0.26 declares them (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class Hist:
    """A histogram cheap enough to observe once per generated token."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_many(self, value: float, n: int) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            out.append((repr(float(bound)), acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out


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
