"""A completion request the edge has validated, as the proxy and admission control take it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from router.core.types import RequestFeatures
from router.requestlog import RequestRecord

__all__ = ["ProxyCall"]


@dataclass(slots=True)
class ProxyCall:
    """A request the edge has validated: where it goes, what it is, what to send."""

    path: str
    body: bytes  # the caller's bytes, sent as they are to a worker serving the model they name
    payload: dict[str, Any]  # the same, parsed
    features: RequestFeatures
    request_id: str
    record: RequestRecord
    predicted_output: float | None = None  # the policy's predicted output tokens (reserved instead of the cap)
    # the policy's own (uncorrected) TTFT and decode-time-per-token predictions, seconds, for its first
    # choice: what that worker's timings are compared with (the views' ttft_bias / tpot_bias)
    predicted_timing: tuple[str, float | None, float | None] | None = None
    sent_at: float = 0.0  # perf_counter() when the current attempt was sent to its worker
    degraded: str | None = None  # what admission control degraded (X-Chimera-Degraded), e.g. "max_tokens=256"
    # why the policy's first choice was chosen (router.proxy.explain), sent with its answer
    why: tuple[str, dict[str, str]] | None = None
    _bodies: dict[str, bytes] = field(default_factory=dict)

    def set_payload(self, payload: dict[str, Any]) -> None:
        """Forward ``payload`` instead of the caller's body (admission control's degradation)."""
        self.payload, self.body = payload, json.dumps(payload, separators=(",", ":")).encode()
        self._bodies.clear()

    def body_for(self, model: str, priority: int | None = None) -> bytes:
        """The body for a worker serving ``model``: the original bytes where the caller named that
        model; with ``model`` put in where it named ``auto`` or its agent (every other field kept), and
        ``priority`` where one is given (a worker that schedules by priority: ``router.priority``)."""
        if priority is not None:
            return json.dumps({**self.payload, "model": model, "priority": priority}, separators=(",", ":")).encode()
        if self.payload.get("model") == model:
            return self.body
        if model not in self._bodies:
            self._bodies[model] = json.dumps({**self.payload, "model": model}, separators=(",", ":")).encode()
        return self._bodies[model]
