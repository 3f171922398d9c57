"""Read a vLLM worker's Prometheus ``/metrics`` into :class:`ScrapedMetrics`.

Why match samples by name rather than by family: ``prometheus_client``'s parser groups a counter's
``X_total`` sample under the family ``X`` only when the ``# TYPE`` line says ``X_total counter``
(what prometheus_client writes); with ``# TYPE X counter`` the ``X_total`` samples land in a
separate "unknown" family, and without a TYPE line every sample is its own family. Looking at
samples by their exposed name works for all three, and for vLLM's ``:`` names.

Why sum over label sets: a worker may expose several ``engine``/``model_name`` label sets (data
parallel engines, several served names); counts add up. KV use is a fraction per engine, so it is
averaged instead.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from router.core.errors import WorkerProtocolError
from router.state.base import ScrapedMetrics

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV = "vllm:kv_cache_usage_perc"
_KV_LEGACY = "vllm:gpu_cache_usage_perc"  # vLLM before the V1 engine
_PREEMPTIONS = "vllm:num_preemptions"
_PREFIX_QUERIES = "vllm:prefix_cache_queries"
_PREFIX_HITS = "vllm:prefix_cache_hits"

_GAUGES = (_RUNNING, _WAITING, _KV, _KV_LEGACY)
_COUNTERS = (_PREEMPTIONS, _PREFIX_QUERIES, _PREFIX_HITS)

# Exposed sample name → the metric it belongs to. Counters appear with or without ``_total``
# (older vLLM exposed ``vllm:num_preemptions_total`` as the base name itself).
_WANTED: dict[str, str] = {name: name for name in _GAUGES}
for _name in _COUNTERS:
    _WANTED[_name] = _name
    _WANTED[_name + "_total"] = _name


def parse_vllm_metrics(text: str) -> ScrapedMetrics:
    """Parse vLLM's exposition text. Raises WorkerProtocolError on text that is not Prometheus
    exposition or that carries none of the load gauges (running, waiting, KV use)."""
    values: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                metric = _WANTED.get(sample.name)
                if metric is not None and math.isfinite(sample.value) and sample.value >= 0:
                    values.setdefault(metric, []).append(float(sample.value))
    # The parser documents no exceptions; fuzzing shows ValueError (bad names, numbers, escapes).
    # The others are defensive: a parser bug on hostile input must not escape as a crash.
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise WorkerProtocolError(f"unparseable /metrics: {exc}") from exc

    kv = values.get(_KV) or values.get(_KV_LEGACY)
    if not (values.get(_RUNNING) or values.get(_WAITING) or kv):
        raise WorkerProtocolError("no vLLM load metrics in /metrics")
    return ScrapedMetrics(
        running=_count(values.get(_RUNNING)),
        waiting=_count(values.get(_WAITING)),
        kv_usage=min(1.0, sum(kv) / len(kv)) if kv else None,
        preemptions_total=_total(values.get(_PREEMPTIONS)),
        prefix_cache_queries_total=_total(values.get(_PREFIX_QUERIES)),
        prefix_cache_hits_total=_total(values.get(_PREFIX_HITS)),
    )


def _count(samples: list[float] | None) -> int | None:
    return round(sum(samples)) if samples else None


def _total(samples: list[float] | None) -> float | None:
    return sum(samples) if samples else None
