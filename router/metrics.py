"""Gateway metrics in a per-app Prometheus registry (no process globals).

Counters and histograms are updated once per finished request from its :class:`RequestRecord`,
through label children resolved once per label values (:class:`_Children`); the fleet gauges are
refreshed from the state's snapshot when ``/metrics`` is scraped.

``chimera serve --workers N`` runs N processes behind one port, and a scrape reaches any one of them:
served from each process's own registry, counters would seem to jump back and forth between
processes. There the server sets ``PROMETHEUS_MULTIPROC_DIR`` (:data:`MULTIPROC_ENV`) before the
processes start, prometheus_client keeps every value in a file of that directory, and ``/metrics``
answers the sum over the processes (gauges: the most recent value any live process set; the
admission queue's depth: their sum).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Generic, Literal, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from router.core.types import FleetSnapshot
from router.requestlog import RequestRecord
from router.state.base import StateInfo

# up to vLLM's own e2e buckets' top (and the default timeouts.response_s, 600 s): a long answer's e2e lands in
# a bucket, not in +Inf where a dashboard's p99 would read as the last bound
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
                   160.0, 320.0, 640.0)  # fmt: skip
RATIO_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)
NONE = "none"  # label value where a request never got that far (no agent, no worker)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's: set, the values of all processes add up

M = TypeVar("M", Counter, Histogram, Gauge)


class _Children(Generic[M]):
    """A labelled metric's children by label values, each looked up through ``labels()`` (which
    validates and takes a lock on every call) only once. Label values here are configured names,
    statuses and fixed kinds, so the cache stays as small as the registry's own."""

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._cache: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._cache.get(values)
        if child is None:
            child = self._cache[values] = self._metric.labels(*values)
        return child


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess = bool(os.environ.get(MULTIPROC_ENV))
        r = self.registry
        latest: Literal["livemostrecent"] = "livemostrecent"  # one process's view of the fleet is as good as another's
        self.requests = Counter("chimera_requests_total", "Finished requests by agent, worker and status.",
                                ["agent", "backend", "status"], registry=r)  # fmt: skip
        self.ttft = Histogram("chimera_ttft_seconds", "Time to the first streamed chunk, seen by the gateway.",
                              ["agent", "backend"], buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.e2e = Histogram("chimera_e2e_seconds", "Request time from arrival to the last byte.",
                             ["agent", "backend"], buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.sla_violations = Counter("chimera_sla_violations_total", "Requests that missed an SLA objective.",
                                      ["agent", "kind"], registry=r)  # fmt: skip
        self.sla_met = Counter("chimera_sla_met_total", "Requests answered in full within every SLA objective set.",
                               ["agent"], registry=r)  # fmt: skip
        self.backend_healthy = Gauge("chimera_backend_healthy", "1 if the worker takes requests.",
                                     ["backend"], registry=r, multiprocess_mode=latest)  # fmt: skip
        self.backend_inflight = Gauge("chimera_backend_inflight", "Requests in flight on the worker.",
                                      ["backend"], registry=r, multiprocess_mode=latest)  # fmt: skip
        self.prediction_error = Histogram("chimera_prediction_error_ratio", "|predicted - actual| / actual.",
                                          ["target"], buckets=RATIO_BUCKETS, registry=r)  # fmt: skip
        self.prediction_bias = Gauge("chimera_backend_prediction_bias",
                                     "Observed / predicted TTFT or decode time on the worker's recent answers "
                                     "(the predictive policy's latency feedback; 1 until seen).",
                                     ["backend", "target"], registry=r, multiprocess_mode=latest)  # fmt: skip
        self.worker_failures = Counter("chimera_worker_failures_total", "Failed attempts on a worker, by kind.",
                                       ["backend", "kind"], registry=r)  # fmt: skip
        # Overload (router.admission, router.ratelimit)
        self.queue_depth = Gauge("chimera_queue_depth", "Requests waiting in the admission queue.",
                                 ["agent"], registry=r, multiprocess_mode="livesum")  # fmt: skip
        self.admission_ratio = Gauge("chimera_admission_ratio",
                                     "The share of its KV budget the worker's reservations may fill (adaptive "
                                     "admission).", ["backend"], registry=r, multiprocess_mode=latest)  # fmt: skip
        self.queue_wait = Histogram("chimera_queue_wait_seconds", "Time spent in the admission queue.",
                                    ["agent"], buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.rejections = Counter("chimera_rejections_total", "Requests answered 429, by reason.",
                                  ["agent", "reason"], registry=r)  # fmt: skip
        self.degradations = Counter("chimera_degradations_total", "Requests served degraded, by kind.",
                                    ["agent", "kind"], registry=r)  # fmt: skip

        self._requests = _Children(self.requests)
        self._ttft = _Children(self.ttft)
        self._e2e = _Children(self.e2e)
        self._sla_violations = _Children(self.sla_violations)
        self._sla_met = _Children(self.sla_met)
        self._prediction_error = _Children(self.prediction_error)
        self._worker_failures = _Children(self.worker_failures)

        self._state_collector = _StateCollector()
        r.register(self._state_collector)
        self._state_counters: tuple[Counter, Counter, Counter] | None = None  # made for a Redis state
        self._state_exported = (0, 0, 0)

    def refresh_state(self, state: StateInfo) -> None:
        """The fleet state's own counters (Redis round trips, outages; kept as plain ints on the hot path),
        brought up to date at scrape time, and its gauges."""
        self._state_collector.state = state
        if state.kind == "memory":
            return
        if self._state_counters is None:
            r = self.registry
            self._state_counters = (
                Counter("chimera_state_redis_commands", "Round trips to Redis (a script call is one).", registry=r),
                Counter("chimera_state_redis_errors", "Redis round trips that failed or timed out.", registry=r),
                Counter("chimera_state_degraded", "Times the fleet state lost Redis and served on its local view.",
                        registry=r),
            )  # fmt: skip
        st = state.stats()
        now = (st.round_trips, st.errors, st.degraded_events)
        for counter, value, exported in zip(self._state_counters, now, self._state_exported, strict=True):
            if value > exported:
                counter.inc(value - exported)
        self._state_exported = now

    def worker_failed(self, backend: str, kind: str) -> None:
        self._worker_failures(backend, kind).inc()

    def observe(self, rec: RequestRecord) -> None:
        agent, backend = rec.agent or NONE, rec.backend or NONE
        self._requests(agent, backend, _status_label(rec)).inc()
        if rec.outcome != "ok":
            return
        if rec.ttft_s is not None:
            self._ttft(agent, backend).observe(rec.ttft_s)
        if rec.e2e_s is not None:
            self._e2e(agent, backend).observe(rec.e2e_s)
        tpot = rec.tpot_s
        met = True
        for kind, actual_s, slo_ms in (
            ("ttft", rec.ttft_s, rec.slo_ttft_ms),
            ("tpot", tpot, rec.slo_tpot_ms),
            ("e2e", rec.e2e_s, rec.slo_e2e_ms),
        ):
            if actual_s is not None and slo_ms is not None and actual_s * 1000.0 > slo_ms:
                self._sla_violations(agent, kind).inc()
                met = False
        if met:
            self._sla_met(agent).inc()
        actual_ms = {"ttft_ms": rec.ttft_s, "tpot_ms": tpot, "e2e_ms": rec.e2e_s}
        for key, predicted in (rec.predicted or {}).items():
            actual = actual_ms.get(key)
            if actual:
                self._prediction_error(key.removesuffix("_ms")).observe(
                    abs(predicted - actual * 1000.0) / (actual * 1000.0)
                )

    def refresh(self, snapshot: FleetSnapshot) -> None:
        for b in snapshot.backends:
            self.backend_healthy.labels(b.name).set(1.0 if b.healthy else 0.0)
            self.backend_inflight.labels(b.name).set(b.inflight_requests)
            self.prediction_bias.labels(b.name, "ttft").set(b.ttft_bias)
            self.prediction_bias.labels(b.name, "tpot").set(b.tpot_bias)

    def render(self) -> tuple[bytes, str]:
        if not self.multiprocess:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        merged = CollectorRegistry(auto_describe=True)  # every process's values, from their files
        MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
        merged.register(self._state_collector)  # this process's view of the fleet state
        return generate_latest(merged), CONTENT_TYPE_LATEST


class _StateCollector(Collector):
    """The fleet state's gauges (degraded now, live replicas), read at scrape time."""

    def __init__(self) -> None:
        self.state: StateInfo | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.state is None or self.state.kind == "memory":
            return
        yield GaugeMetricFamily("chimera_state_degraded_now", "1 while the fleet state is degraded.",
                                value=1.0 if self.state.degraded else 0.0)  # fmt: skip
        yield GaugeMetricFamily("chimera_state_replicas", "Live gateway replicas sharing the fleet state.",
                                value=len(self.state.replicas()))  # fmt: skip


def _status_label(rec: RequestRecord) -> str:
    # A stream that broke mid-way was sent as 200; it is counted as the failure it was.
    if rec.outcome == "worker_error" and rec.status == 200:
        return "502" if rec.error != "WorkerTimeout" else "504"
    if rec.outcome == "disconnected":
        return "499"
    return str(rec.status or 500)
