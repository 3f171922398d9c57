"""In-process FleetState: one gateway's own view of its workers.

Every worker has a small mutable record updated by ``reserve``/``release`` (this gateway's
in-flight load) and by ``record_probe``/``record_result`` (health, scraped load, latency EWMAs).
``snapshot()`` copies the records into frozen :class:`BackendView` objects; it runs on every
request, so it does no I/O and no locking (everything happens on one event loop, and no method
awaits in the middle of an update, so each update is atomic with respect to the others). Building
a view costs microseconds, so views are cached per worker and rebuilt only when that worker's
record changed or ``AGE_RESOLUTION_S`` has passed (the ages in a view are that fresh).

Health is a small state machine per worker:

* workers start healthy (optimistic), so a fresh gateway serves before the first probe lands;
* ``eject_after_failures`` consecutive failures eject it — probe failures and proxied-request
  worker failures count alike, and any success (probe or request) resets the run;
* once ejected, only probes re-admit it, after ``readmit_after_successes`` consecutive successful
  probes (an ejected worker gets no traffic, so requests cannot vouch for it).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.config import BackendConfig, HealthConfig
from router.state.base import Reservation, ScrapedMetrics
from router.types import BackendView, FleetSnapshot

log = logging.getLogger(__name__)

EWMA_ALPHA = 0.2  # weight of the newest TTFT/TPOT sample
AGE_RESOLUTION_S = 0.05  # a cached view's metrics_age_s / last_success_age_s lag by at most this


@dataclass(slots=True)
class _Record:
    """Mutable per-worker state; static config fields are copied in once."""

    name: str
    model: str
    kv_budget_tokens: int
    max_model_len: int
    tags: frozenset[str]
    healthy: bool = True
    consecutive_failures: int = 0
    consecutive_probe_successes: int = 0
    inflight_requests: int = 0
    inflight_tokens: int = 0
    metrics: ScrapedMetrics | None = None
    metrics_at: float | None = None
    last_success_at: float | None = None
    ttft_ewma_s: float | None = None
    tpot_ewma_s: float | None = None
    view: BackendView | None = None  # cache; every mutator resets it through _touch()


class MemoryFleetState:
    """FleetState kept in this process (``gateway.state: memory``)."""

    kind: str = "memory"

    def __init__(
        self,
        backends: Sequence[BackendConfig],
        health: HealthConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._health = health
        self._clock = clock
        self._records: dict[str, _Record] = {
            b.name: _Record(b.name, b.model, b.kv_budget_tokens, b.max_model_len, frozenset(b.tags)) for b in backends
        }
        self._reservations: dict[str, Reservation] = {}
        # Ids unique per process start (the prefix) and cheap (no syscall per request, unlike uuid4).
        self._id_prefix = os.urandom(4).hex()
        self._ids = itertools.count(1)
        self._any_probe_ok = False
        self._views: tuple[BackendView, ...] | None = None  # None: some record changed
        self._views_at = -math.inf

    # -- lifecycle (nothing to connect to) --

    @property
    def degraded(self) -> bool:
        return False

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    # -- reads --

    def snapshot(self) -> FleetSnapshot:
        now = self._clock()
        if now - self._views_at >= AGE_RESOLUTION_S:
            for r in self._records.values():
                r.view = None
            self._views, self._views_at = None, now
        if self._views is None:
            self._views = tuple(r.view or self._build(r, now) for r in self._records.values())
        return FleetSnapshot(self._views, now)

    def any_probe_ok(self) -> bool:
        return self._any_probe_ok

    # -- in-flight accounting --

    async def reserve(self, backend: str, tokens: int) -> Reservation:
        rec = self._touch(backend)
        res = Reservation(id=f"{self._id_prefix}-{next(self._ids)}", backend=backend, tokens=max(0, tokens))
        rec.inflight_requests += 1
        rec.inflight_tokens += res.tokens
        self._reservations[res.id] = res
        return res

    async def release(self, reservation: Reservation) -> None:
        # Keyed by id and popped, so a double release (or one from elsewhere) cannot go negative.
        res = self._reservations.pop(reservation.id, None)
        if res is None:
            return
        rec = self._touch(res.backend)
        rec.inflight_requests = max(0, rec.inflight_requests - 1)
        rec.inflight_tokens = max(0, rec.inflight_tokens - res.tokens)

    # -- health --

    async def record_probe(self, backend: str, ok: bool, metrics: ScrapedMetrics | None) -> None:
        rec = self._touch(backend)
        now = self._clock()
        if metrics is not None:
            rec.metrics, rec.metrics_at = metrics, now
        if not ok:
            rec.consecutive_probe_successes = 0
            self._failure(rec, "probe")
            return
        self._any_probe_ok = True
        rec.last_success_at = now
        rec.consecutive_failures = 0
        rec.consecutive_probe_successes += 1
        if not rec.healthy and rec.consecutive_probe_successes >= self._health.readmit_after_successes:
            rec.healthy = True
            log.info("worker %s re-admitted after %d good probes", rec.name, rec.consecutive_probe_successes)

    async def record_result(
        self, backend: str, ok: bool, *, ttft_s: float | None = None, tpot_s: float | None = None
    ) -> None:
        rec = self._touch(backend)
        if not ok:
            rec.consecutive_probe_successes = 0
            self._failure(rec, "request")
            return
        rec.last_success_at = self._clock()
        rec.consecutive_failures = 0
        rec.ttft_ewma_s = _ewma(rec.ttft_ewma_s, ttft_s)
        rec.tpot_ewma_s = _ewma(rec.tpot_ewma_s, tpot_s)

    # -- internals --

    def _failure(self, rec: _Record, source: str) -> None:
        rec.consecutive_failures += 1
        if rec.healthy and rec.consecutive_failures >= self._health.eject_after_failures:
            rec.healthy = False
            log.warning(
                "worker %s ejected after %d consecutive failures (last: %s)", rec.name, rec.consecutive_failures, source
            )

    def _touch(self, backend: str) -> _Record:
        """The record about to change, its cached view dropped."""
        try:
            rec = self._records[backend]
        except KeyError:
            raise ValueError(f"unknown backend {backend!r}") from None
        rec.view = None
        self._views = None
        return rec

    @staticmethod
    def _build(r: _Record, now: float) -> BackendView:
        r.view = _view(r, now)
        return r.view


def _ewma(old: float | None, sample: float | None) -> float | None:
    if sample is None or not math.isfinite(sample) or sample < 0:
        return old
    return sample if old is None else old + EWMA_ALPHA * (sample - old)


def _view(r: _Record, now: float) -> BackendView:
    m = r.metrics
    return BackendView(
        name=r.name,
        model=r.model,
        healthy=r.healthy,
        kv_budget_tokens=r.kv_budget_tokens,
        max_model_len=r.max_model_len,
        tags=r.tags,
        inflight_requests=r.inflight_requests,
        inflight_tokens=r.inflight_tokens,
        running=m.running if m else None,
        waiting=m.waiting if m else None,
        kv_usage=m.kv_usage if m else None,
        metrics_age_s=None if r.metrics_at is None else max(0.0, now - r.metrics_at),
        consecutive_failures=r.consecutive_failures,
        last_success_age_s=None if r.last_success_at is None else max(0.0, now - r.last_success_at),
        ttft_ewma_s=r.ttft_ewma_s,
        tpot_ewma_s=r.tpot_ewma_s,
    )
