"""In-process FleetState: one gateway's own view of its workers.

Every worker has a small mutable record (:mod:`router.state.table`, which also holds the health
rules and the cached snapshot) updated by ``reserve``/``release`` (this gateway's in-flight load)
and by ``record_probe``/``record_result`` (health, scraped load, latency EWMAs).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence

from router.core.config import BackendConfig, HealthConfig
from router.core.types import FleetSnapshot
from router.state.base import Feedback, ReplicaLoad, Reservation, ScrapedMetrics, StateStats
from router.state.buckets import TokenBuckets
from router.state.table import AGE_RESOLUTION_S, EWMA_ALPHA, FleetTable

__all__ = ["AGE_RESOLUTION_S", "EWMA_ALPHA", "MemoryFleetState"]


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
        self._table = FleetTable(backends, health, clock)
        self._reservations: dict[str, Reservation] = {}
        # Ids unique per process start (the prefix) and cheap (no syscall per request, unlike uuid4).
        self._id_prefix = os.urandom(4).hex()
        self._ids = itertools.count(1)
        self._buckets = TokenBuckets(clock)

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
        return self._table.snapshot()

    def any_probe_ok(self) -> bool:
        return self._table.any_probe_ok

    def replicas(self) -> tuple[ReplicaLoad, ...]:
        return ()

    def stats(self) -> StateStats:
        return StateStats()

    async def should_probe(self, backend: str) -> bool:
        return True

    # -- in-flight accounting --

    async def reserve(self, backend: str, tokens: int, prefill: int = 0) -> Reservation:
        res = Reservation(id=f"{self._id_prefix}-{next(self._ids)}", backend=backend, tokens=max(0, tokens))
        self._table.add_load(backend, 1, res.tokens)
        self._table.start_prefill(res.id, backend, prefill)
        self._reservations[res.id] = res
        return res

    def first_token(self, reservation: Reservation) -> None:
        self._table.end_prefill(reservation.id)

    async def release(self, reservation: Reservation) -> None:
        # Keyed by id and popped, so a double release (or one from elsewhere) cannot go negative.
        res = self._reservations.pop(reservation.id, None)
        if res is not None:
            self._table.add_load(res.backend, -1, -res.tokens)
            self._table.end_prefill(res.id)

    async def take_tokens(self, agent: str, requests: int, tokens: int, rpm: int | None, tpm: int | None) -> float:
        return self._buckets.take(agent, requests, tokens, rpm, tpm)

    # -- health --

    async def record_probe(self, backend: str, ok: bool, metrics: ScrapedMetrics | None) -> None:
        self._table.probe(backend, ok, metrics)

    async def record_result(
        self,
        backend: str,
        ok: bool,
        *,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        feedback: Feedback | None = None,
    ) -> None:
        self._table.result(backend, ok, ttft_s, tpot_s, feedback)

    # -- prefix index: no other gateway to tell --

    def share_prefix(self, hashes: Sequence[int], backend: str) -> None:
        return None

    def on_shared_prefix(self, apply: Callable[[Sequence[int], str], None]) -> None:
        return None
