"""The FleetState interface: the gateway's view of every worker's load and health.

Reads are synchronous and local (``snapshot()`` is on the hot path and must not do I/O);
writes are async so a shared implementation (Redis) can make them one round trip each.

``FleetState`` composes small protocols, one per kind of consumer, so each depends only on what it
uses: :class:`FleetView` (admission, routing), :class:`LoadLedger` (the proxy), :class:`ProbeSink`
(the prober), :class:`RateBuckets` (rate limits), :class:`PrefixGossip` (the predictor's runtime),
:class:`StateInfo` (``/fleet``, ``/metrics``) and :class:`Lifecycle` (the app's lifespan).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from router.core.types import FleetSnapshot


@dataclass(frozen=True, slots=True)
class ScrapedMetrics:
    """What a prober read from a worker's /metrics."""

    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    preemptions_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    engine: str | None = None  # whose metric names they were read from (backends/engines.py)


@dataclass(frozen=True, slots=True)
class Reservation:
    """A dispatched request's claim on a worker: one in-flight request and ``tokens`` KV tokens."""

    id: str
    backend: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Feedback:
    """A streamed answer's timings on its worker beside what the policy predicted for them at dispatch
    (seconds; ``None`` where one side is missing): what the views' ``ttft_bias`` / ``tpot_bias`` follow."""

    ttft_s: float | None  # the worker's own: from sending the request to the first token
    predicted_ttft_s: float | None
    tpot_s: float | None
    predicted_tpot_s: float | None


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One gateway replica's reservations, as a shared state sees them (``/fleet``'s ``replicas``)."""

    id: str
    is_self: bool
    inflight_requests: int
    inflight_tokens: int


@dataclass(frozen=True, slots=True)
class StateStats:
    """Counters of a shared state's own traffic, for ``/metrics`` (all zero for memory)."""

    round_trips: int = 0  # requests sent to the shared store (a pipeline or a script is one)
    errors: int = 0  # round trips that failed or timed out
    degraded_events: int = 0  # times the state lost its store and fell back to its local view


class Lifecycle(Protocol):
    """Connecting to the store and letting go of it, around the app's lifespan."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class FleetView(Protocol):
    """The hot-path read of every worker's load and health (admission, routing, ``/ready``)."""

    def snapshot(self) -> FleetSnapshot:
        """The current view of every configured worker (no I/O)."""
        ...


class LoadLedger(Protocol):
    """A dispatch's writes: load claimed and given back on a worker, and how it answered (the proxy)."""

    async def reserve(self, backend: str, tokens: int, prefill: int = 0) -> Reservation:
        """Claim one in-flight request and ``tokens`` KV tokens on ``backend``; ``prefill``: the prompt
        tokens the worker has yet to prefill for it (the view's ``pending_prefill_tokens`` until
        :meth:`first_token` or the release)."""
        ...

    def first_token(self, reservation: Reservation) -> None:
        """The reservation's first token came: its prompt is prefilled (a no-op the second time)."""
        ...

    async def release(self, reservation: Reservation) -> None:
        """Give a reservation back. The local accounting must be done before the first suspension
        and whatever follows must survive the caller's cancellation (a client that hung up is
        cancelled mid-``finally``): the proxy awaits this without ``asyncio.shield``, whose task per
        request would be paid by every request, not only by the cancelled ones."""
        ...

    async def record_result(
        self,
        backend: str,
        ok: bool,
        *,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        feedback: Feedback | None = None,
    ) -> None:
        """Passive health: a proxied request's outcome (a worker failure or success) and timings, and
        how they compare with what the policy predicted for them where it did (``feedback``)."""
        ...


class ProbeSink(Protocol):
    """Active health: which worker this gateway probes this round, and what each probe saw (the prober)."""

    async def should_probe(self, backend: str) -> bool:
        """Whether this gateway probes ``backend`` this round (a shared state elects one replica per
        worker, so N replicas do not multiply the probe load on it; the others read its results)."""
        ...

    async def record_probe(self, backend: str, ok: bool, metrics: ScrapedMetrics | None) -> None:
        """Active health: a probe's outcome; ``metrics`` when /metrics was scraped."""
        ...


class RateBuckets(Protocol):
    """Per-agent rate-limit buckets, shared by every replica where the state is (``router.ratelimit``)."""

    async def take_tokens(self, agent: str, requests: int, tokens: int, rpm: int | None, tpm: int | None) -> float:
        """Rate limits: take ``requests`` and ``tokens`` from the agent's per-minute buckets (shared
        by every replica where the state is), or neither; 0 when taken, else the seconds until they
        would be (the Retry-After). ``None`` limits are unlimited."""
        ...


class PrefixGossip(Protocol):
    """Prefix-index news passed between gateways (the predictor's runtime, ``router.learning``)."""

    def share_prefix(self, hashes: Sequence[int], backend: str) -> None:
        """Tell the other gateways that ``backend`` was just sent a prompt with these leading block
        hashes (what the predictor's prefix index learnt). No I/O: a shared state sends them with
        its next sync; a local one has no one to tell."""
        ...

    def on_shared_prefix(self, apply: Callable[[Sequence[int], str], None]) -> None:
        """Have ``apply(hashes, backend)`` called (on the event loop) for each prefix another gateway
        shares from now on."""
        ...


class StateInfo(Protocol):
    """The state's own condition: its kind, outages, replicas and traffic (``/fleet``, ``/metrics``)."""

    kind: str  # "memory" | "redis"; /fleet reports "degraded" when ``degraded`` is true

    @property
    def degraded(self) -> bool: ...

    def replicas(self) -> tuple[ReplicaLoad, ...]:
        """Every live gateway replica's load (empty where the state is not shared)."""
        ...

    def stats(self) -> StateStats: ...

    def any_probe_ok(self) -> bool:
        """Whether any worker has ever answered a probe (``/ready``: workers start optimistically
        healthy, so ``healthy`` alone cannot tell a fresh gateway from a working one)."""
        ...


class FleetState(Lifecycle, FleetView, LoadLedger, ProbeSink, RateBuckets, PrefixGossip, StateInfo, Protocol):
    """All of them: what ``MemoryFleetState`` and ``RedisFleetState`` implement and ``create_state`` returns."""
