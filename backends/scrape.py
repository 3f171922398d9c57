"""Read a worker's Prometheus ``/metrics`` into :class:`ScrapedMetrics`, by its engine's names
(:mod:`backends.engines`).

Why match samples by name rather than by family: ``prometheus_client``'s parser groups a counter's
``X_total`` sample under the family ``X`` only when the ``# TYPE`` line says ``X_total counter``
(what prometheus_client writes); with ``# TYPE X counter`` the ``X_total`` samples land in a
separate "unknown" family, and without a TYPE line every sample is its own family. Looking at
samples by their exposed name works for all three, and for vLLM's and SGLang's ``:`` names.

Why sum over label sets: a worker may expose several ``engine``/``model_name``/``dp_rank`` label sets (data
parallel engines, several served names); counts add up. KV use is a fraction per engine, so it is
averaged instead.
"""

from __future__ import annotations

import math
from functools import lru_cache

from prometheus_client.parser import text_string_to_metric_families

from backends.engines import VLLM, EngineMetrics
from router.core.errors import WorkerProtocolError
from router.state.base import ScrapedMetrics


def parse_metrics(text: str, spec: EngineMetrics = VLLM, kv_usage: float | None = None) -> ScrapedMetrics:
    """Parse exposition text by ``spec``'s names (``kv_usage``: KV use read elsewhere, for an engine whose
    Prometheus text has none). Raises WorkerProtocolError on text that is not Prometheus exposition or that
    carries none of the engine's load gauges (running, waiting, KV use)."""
    wanted = _wanted(spec)
    skip = spec.skip_labels
    values: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                metric = wanted.get(sample.name)
                if metric is None or not (math.isfinite(sample.value) and sample.value >= 0):
                    continue
                if skip and any(k in sample.labels and sample.labels[k] != v for k, v in skip):
                    continue
                values.setdefault(metric, []).append(float(sample.value))
    # The parser documents no exceptions; fuzzing shows ValueError (bad names, numbers, escapes).
    # The others are defensive: a parser bug on hostile input must not escape as a crash.
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise WorkerProtocolError(f"unparseable /metrics: {exc}") from exc

    running, waiting = _first(values, spec.running), _first(values, spec.waiting)
    kv = kv_usage if kv_usage is not None else _kv(values, spec)
    if running is None and waiting is None and kv is None:
        raise WorkerProtocolError(f"no {spec.engine} load metrics in {spec.metrics_path}")
    return ScrapedMetrics(
        running=None if running is None else round(sum(running)),
        waiting=None if waiting is None else round(sum(waiting)),
        kv_usage=None if kv is None else min(1.0, kv),
        preemptions_total=_total(_first(values, spec.preemptions)),
        prefix_cache_queries_total=_total(_first(values, spec.prefix_queries)),
        prefix_cache_hits_total=_total(_first(values, spec.prefix_hits)),
        engine=spec.engine,
    )


@lru_cache(maxsize=16)
def _wanted(spec: EngineMetrics) -> dict[str, str]:
    """Exposed sample name -> the metric it is read as, for one engine (built once per engine)."""
    wanted: dict[str, str] = {}
    for field in (spec.running, spec.waiting, spec.kv_fraction):
        for name in field:
            wanted[name] = name
    for extra in (spec.kv_used_tokens, spec.kv_capacity_tokens):
        if extra is not None:
            wanted[extra] = extra
    for name in (*spec.preemptions, *spec.prefix_queries, *spec.prefix_hits):
        wanted[name] = wanted[name + "_total"] = name  # counters appear with or without _total
    return wanted


def _first(values: dict[str, list[float]], names: tuple[str, ...]) -> list[float] | None:
    return next((values[n] for n in names if values.get(n)), None)


def _kv(values: dict[str, list[float]], spec: EngineMetrics) -> float | None:
    fractions = _first(values, spec.kv_fraction)
    if fractions:
        return sum(fractions) / len(fractions)
    used = values.get(spec.kv_used_tokens or "")
    capacity = values.get(spec.kv_capacity_tokens or "")
    if used and capacity and sum(capacity) > 0:
        return sum(used) / sum(capacity)
    return None


def _total(samples: list[float] | None) -> float | None:
    return sum(samples) if samples else None
