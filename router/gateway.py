"""The objects one gateway app shares between requests, held in its lifespan state.

Handlers reach them with :func:`gateway_of`; nothing here is global, so two apps in one process
(tests, replicas) never share a counter, a registry or a client.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from starlette.requests import HTTPConnection

from backends.client import WorkerClient
from router.admission import AdmissionController
from router.audit import audit
from router.auth import AgentResolver
from router.core.config import Config
from router.core.types import Policy
from router.metrics import Metrics
from router.priority import PriorityFn
from router.promptlen import PromptLengths
from router.requestlog import RequestLog, RequestRecord
from router.state.base import FleetState, Reservation

if TYPE_CHECKING:  # the predictor brings scikit-learn: a gateway without one never imports it
    from router.learning import PredictorRuntime

STATE_KEY = "gateway"


@dataclass(eq=False)
class Gateway:
    config: Config
    workers: WorkerClient
    state: FleetState
    policy: Policy
    policy_name: str
    metrics: Metrics
    log: RequestLog
    agents: AgentResolver
    predictor: PredictorRuntime | None = None  # sketches, prefix index, online refits (when configured)
    admission: AdmissionController | None = None  # overload handling (when gateway.admission is configured)
    # the body's `priority` for workers that schedule by it (router.priority; when a backend does)
    engine_priority: PriorityFn | None = None
    # the prompt-token estimate's rates, calibrated per served model on the workers' usage (this process's own)
    prompt_lengths: PromptLengths = field(default_factory=PromptLengths)
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def next_seq(self) -> int:
        return next(self._seq)

    async def release(self, reservation: Reservation) -> None:
        """Give a worker's reservation back (its bookkeeping completes even when the caller is cancelled) and let
        admission control grant what the freed capacity now fits, cancelled or not."""
        try:
            await self.state.release(reservation)
        finally:
            if self.admission is not None:
                self.admission.wake()

    def finish(self, record: RequestRecord) -> None:
        """Account for a finished request exactly once: metrics, the request log, the audit line, and what the
        worker's usage teaches the prompt estimate."""
        if record.e2e_s is None:
            record.e2e_s = time.perf_counter() - record.started
        if record.prompt_tokens_exact:
            self.prompt_lengths.observe(record.model, record.prompt, record.prompt_tokens)
        self.metrics.observe(record)
        self.log.write(record)
        audit(record)
        if self.predictor is not None:
            self.predictor.observe(record)


def gateway_of(conn: HTTPConnection) -> Gateway:
    return cast(Gateway, conn.state.gateway)


def gateway_in(scope_state: dict[str, Any]) -> Gateway | None:
    gw = scope_state.get(STATE_KEY)
    return gw if isinstance(gw, Gateway) else None
