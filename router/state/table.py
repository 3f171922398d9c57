"""The per-worker records every FleetState keeps locally, and the health rules that update them.

:class:`FleetTable` is shared by ``MemoryFleetState`` and ``RedisFleetState``, so health and
latency semantics are the same code in both (Redis only adds where the inputs come from: other
replicas' reservations, and probes published by whichever replica probed the worker).

Health is a small state machine per worker:

* workers start healthy (optimistic), so a fresh gateway serves before the first probe lands;
* ``eject_after_failures`` consecutive failures eject it — probe failures and proxied-request
  worker failures count alike, and any success (probe or request) resets the run;
* once ejected, only probes re-admit it, after ``readmit_after_successes`` consecutive successful
  probes (an ejected worker gets no traffic, so requests cannot vouch for it);
* a re-admitted worker is on probation until a request succeeds on it: its first failure ejects it
  again, and such a repeat ejection keeps it out for ``eject_backoff_s`` * 2^(repeats - 1) (at most
  ``eject_backoff_max_s``) whatever the probes say — so a worker whose ``/health`` is fine while its
  completions fail costs one retry per backoff period, not a few per probe interval (as Envoy's
  outlier ejection does). A request's success ends probation and forgets the repeats.

``snapshot()`` runs on every request, so it does no I/O and no locking (everything happens on one
event loop and no update awaits midway). Views are cached per worker and rebuilt only when that
worker's record changed or ``AGE_RESOLUTION_S`` has passed (the ages in a view are that fresh).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.core.config import BackendConfig, HealthConfig
from router.core.types import BackendView, FleetSnapshot
from router.state.base import Feedback, ScrapedMetrics

log = logging.getLogger("router.state")

EWMA_ALPHA = 0.2  # weight of the newest TTFT/TPOT sample (and of the newest observed / predicted ratio)
BIAS_SAMPLE_LIMIT = 4.0  # one request's observed / predicted ratio counts as at most this (or 1 / this)
BIAS_LIMIT = 2.5  # the correction a view carries is within [1 / this, this]
# A ratio fades back towards 1 with this half-life while its worker gets no new evidence: a worker
# avoided because it was slow once (a burst, a preemption storm) is tried again, not avoided forever.
BIAS_HALF_LIFE_S = 120.0
AGE_RESOLUTION_S = 0.05  # a cached view's metrics_age_s / last_success_age_s lag by at most this


@dataclass(slots=True)
class WorkerRecord:
    """Mutable per-worker state; static config fields are copied in once."""

    name: str
    model: str
    kv_budget_tokens: int
    max_model_len: int
    tags: frozenset[str]
    gpu: str | None = None
    engine: str | None = None  # configured (None: detected from its metrics)
    healthy: bool = True
    consecutive_failures: int = 0
    consecutive_probe_successes: int = 0
    probation: bool = False  # re-admitted, no request has succeeded on it since
    repeat_ejections: int = 0  # ejections while on probation, since the last request success
    ejected_until: float = -math.inf  # probes cannot re-admit before this
    inflight_requests: int = 0  # this process's own reservations
    inflight_tokens: int = 0
    pending_prefill: int = 0  # prompt tokens of this process's requests with no first token yet
    other_requests: int = 0  # other replicas' reservations (shared states only)
    other_tokens: int = 0
    other_prefill: int = 0  # other replicas' pending prefill tokens there (shared states only)
    metrics: ScrapedMetrics | None = None
    metrics_at: float | None = None
    last_success_at: float | None = None
    ttft_ewma_s: float | None = None
    tpot_ewma_s: float | None = None
    ttft_log_bias: float = 0.0  # EWMA of log(observed / predicted) over requests dispatched with a prediction
    tpot_log_bias: float = 0.0
    bias_at: float = 0.0  # when the log biases were last updated (they fade from there)
    view: BackendView | None = None  # cache; every mutator resets it through FleetTable.touch()


class FleetTable:
    """Every configured worker's record, the health rules, and the cached snapshot."""

    def __init__(self, backends: Sequence[BackendConfig], health: HealthConfig, clock: Callable[[], float]) -> None:
        self.health = health
        self.clock = clock
        self.records: dict[str, WorkerRecord] = {
            b.name: WorkerRecord(
                b.name, b.model, b.kv_budget_tokens, b.max_model_len, frozenset(b.tags), b.shared_gpu, b.engine
            )
            for b in backends
        }
        self.any_probe_ok = False
        self._prefilling: dict[str, tuple[str, int]] = {}  # reservation id -> (backend, prompt tokens)
        self._views: tuple[BackendView, ...] | None = None  # None: some record changed
        self._views_at = -math.inf

    def snapshot(self) -> FleetSnapshot:
        now = self.clock()
        if now - self._views_at >= AGE_RESOLUTION_S:
            for r in self.records.values():
                r.view = None
            self._views, self._views_at = None, now
        if self._views is None:
            self._views = tuple(r.view or _build(r, now) for r in self.records.values())
        return FleetSnapshot(self._views, now)

    def touch(self, backend: str) -> WorkerRecord:
        """The record about to change, its cached view dropped."""
        try:
            rec = self.records[backend]
        except KeyError:
            raise ValueError(f"unknown backend {backend!r}") from None
        rec.view = None
        self._views = None
        return rec

    # -- load --

    def add_load(self, backend: str, requests: int, tokens: int) -> WorkerRecord:
        rec = self.touch(backend)
        rec.inflight_requests = max(0, rec.inflight_requests + requests)
        rec.inflight_tokens = max(0, rec.inflight_tokens + tokens)
        return rec

    def start_prefill(self, key: str, backend: str, tokens: int) -> None:
        """``tokens`` prompt tokens sent to ``backend`` under ``key`` (a reservation id) await their prefill."""
        if tokens > 0 and key not in self._prefilling:
            self._prefilling[key] = (backend, tokens)
            self.touch(backend).pending_prefill += tokens

    def end_prefill(self, key: str) -> str | None:
        """``key``'s prefill is done (its first token came) or moot (released): idempotent. Returns the
        backend whose backlog shrank, if any."""
        hit = self._prefilling.pop(key, None)
        if hit is None:
            return None
        rec = self.touch(hit[0])
        rec.pending_prefill = max(0, rec.pending_prefill - hit[1])
        return hit[0]

    def drop_other_prefill(self) -> None:
        """Forget the other replicas' prefill backlog (a shared state lost touch with them)."""
        for rec in self.records.values():
            if rec.other_prefill:
                self.touch(rec.name).other_prefill = 0

    def set_other_load(self, backend: str, requests: int, tokens: int, prefill: int = 0) -> None:
        """The other replicas' totals on ``backend``: in-flight requests, tokens, pending prefill tokens."""
        rec = self.records.get(backend)
        if rec is not None and (rec.other_requests, rec.other_tokens, rec.other_prefill) != (requests, tokens, prefill):
            self.touch(backend)
            rec.other_requests, rec.other_tokens, rec.other_prefill = requests, tokens, prefill

    # -- health --

    def probe(self, backend: str, ok: bool, metrics: ScrapedMetrics | None, at: float | None = None) -> None:
        """Active health: a probe's outcome at ``at`` (default: now)."""
        rec = self.touch(backend)
        at = self.clock() if at is None else at
        if metrics is not None:
            rec.metrics, rec.metrics_at = metrics, at
        if not ok:
            rec.consecutive_probe_successes = 0
            self._failure(rec, "probe")
            return
        self.any_probe_ok = True
        rec.last_success_at = at if rec.last_success_at is None else max(rec.last_success_at, at)
        rec.consecutive_failures = 0
        rec.consecutive_probe_successes += 1
        if (
            not rec.healthy
            and rec.consecutive_probe_successes >= self.health.readmit_after_successes
            and at >= rec.ejected_until
        ):
            rec.healthy = True
            rec.probation = True
            log.info("worker %s re-admitted after %d good probes", rec.name, rec.consecutive_probe_successes)

    def result(
        self, backend: str, ok: bool, ttft_s: float | None, tpot_s: float | None, feedback: Feedback | None = None
    ) -> None:
        """Passive health: a proxied request's outcome and timings; with ``feedback``, how far off the
        predictions for this worker run (``ttft_bias``, ``tpot_bias``)."""
        rec = self.touch(backend)
        if not ok:
            rec.consecutive_probe_successes = 0
            self._failure(rec, "request")
            return
        rec.last_success_at = self.clock()
        rec.consecutive_failures = 0
        rec.probation, rec.repeat_ejections = False, 0
        rec.ttft_ewma_s = ewma(rec.ttft_ewma_s, ttft_s)
        rec.tpot_ewma_s = ewma(rec.tpot_ewma_s, tpot_s)
        if feedback is not None:
            now = self.clock()
            fade = _fade(rec, now)
            rec.ttft_log_bias = log_ratio_ewma(rec.ttft_log_bias * fade, feedback.ttft_s, feedback.predicted_ttft_s)
            rec.tpot_log_bias = log_ratio_ewma(rec.tpot_log_bias * fade, feedback.tpot_s, feedback.predicted_tpot_s)
            rec.bias_at = now

    def _failure(self, rec: WorkerRecord, source: str) -> None:
        rec.consecutive_failures += 1
        if rec.healthy and rec.probation:
            rec.healthy, rec.probation = False, False
            rec.repeat_ejections += 1
            hold = min(self.health.eject_backoff_max_s, self.health.eject_backoff_s * 2 ** (rec.repeat_ejections - 1))
            rec.ejected_until = self.clock() + hold
            log.warning("worker %s failed again on probation (%s): ejected for at least %.1f s", rec.name, source, hold)
        elif rec.healthy and rec.consecutive_failures >= self.health.eject_after_failures:
            rec.healthy = False
            log.warning(
                "worker %s ejected after %d consecutive failures (last: %s)", rec.name, rec.consecutive_failures, source
            )


def ewma(old: float | None, sample: float | None) -> float | None:
    if sample is None or not math.isfinite(sample) or sample < 0:
        return old
    return sample if old is None else old + EWMA_ALPHA * (sample - old)


_SAMPLE_LOG_LIMIT = math.log(BIAS_SAMPLE_LIMIT)
_VIEW_LOG_LIMIT = math.log(BIAS_LIMIT)
_LN2 = math.log(2.0)


def log_ratio_ewma(old: float, observed: float | None, predicted: float | None) -> float:
    """``old`` moved towards ``log(observed / predicted)`` (each sample clipped to ±log 4), or
    ``old`` when either is missing or not a positive finite number."""
    if observed is None or predicted is None or not (0.0 < observed < math.inf and 0.0 < predicted < math.inf):
        return old
    r = math.log(observed) - math.log(predicted)
    return old + EWMA_ALPHA * (max(-_SAMPLE_LOG_LIMIT, min(_SAMPLE_LOG_LIMIT, r)) - old)


def _fade(r: WorkerRecord, now: float) -> float:
    """How much of ``r``'s log biases is left at ``now`` (half-life ``BIAS_HALF_LIFE_S``)."""
    if not (r.ttft_log_bias or r.tpot_log_bias):
        return 1.0
    return math.exp(-_LN2 * max(0.0, now - r.bias_at) / BIAS_HALF_LIFE_S)


def _bias(log_bias: float, fade: float) -> float:
    return math.exp(max(-_VIEW_LOG_LIMIT, min(_VIEW_LOG_LIMIT, log_bias * fade))) if log_bias else 1.0


def _build(r: WorkerRecord, now: float) -> BackendView:
    m = r.metrics
    fade = _fade(r, now)
    r.view = BackendView(
        name=r.name,
        model=r.model,
        healthy=r.healthy,
        kv_budget_tokens=r.kv_budget_tokens,
        max_model_len=r.max_model_len,
        tags=r.tags,
        inflight_requests=r.inflight_requests + r.other_requests,
        inflight_tokens=r.inflight_tokens + r.other_tokens,
        pending_prefill_tokens=r.pending_prefill + r.other_prefill,
        running=m.running if m else None,
        waiting=m.waiting if m else None,
        kv_usage=m.kv_usage if m else None,
        metrics_age_s=None if r.metrics_at is None else max(0.0, now - r.metrics_at),
        consecutive_failures=r.consecutive_failures,
        last_success_age_s=None if r.last_success_at is None else max(0.0, now - r.last_success_at),
        ttft_ewma_s=r.ttft_ewma_s,
        tpot_ewma_s=r.tpot_ewma_s,
        ttft_bias=_bias(r.ttft_log_bias, fade),
        tpot_bias=_bias(r.tpot_log_bias, fade),
        gpu=r.gpu,
        engine=r.engine or (m.engine if m else None),
    )
    return r.view
