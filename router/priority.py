"""The ``priority`` a gateway sends to workers that schedule by priority (vLLM's ``--scheduling-policy priority``).

Such a worker orders its waiting queue by ``(priority, arrival)``, the lower number first, and under KV
pressure preempts the running request last in that order. For a backend configured with
``scheduling_policy: priority``, the gateway sets in a request's body (replacing any ``priority`` the caller sent:
on such a worker a caller's own value would outrank every agent's; ``x-priority`` is how a caller asks for less)

    priority = round(1000 x (level + now / aging_s + remaining / tokens_per_level))

* ``level``: the request's effective priority: its agent's ``priority``, or a less urgent ``x-priority``;
* ``now / aging_s``: the wall clock, so a request sent ``aging_s`` later counts one level less urgent; every
  gateway replica ages alike, and no request waits behind later ones for ever (the admission queue's rule,
  ``router/admission.py``, carried into the worker's queue);
* ``remaining / tokens_per_level`` (``gateway.engine_priority.tokens_per_level``; with the predictive policy):
  the output tokens predicted for this request and its workflow's later stages, so workflows close to done go
  first — Chimera's shortest-remaining-workflow-first with aging.

In thousandths of a level, as vLLM's field is an integer. A worker under ``fcfs`` ignores the field (vLLM 0.26
takes it and does nothing with it; checked on an H200), so its body is left as the caller sent it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from router.core.config import EnginePriorityConfig
from router.core.types import RequestFeatures

SCALE = 1000.0  # integer steps per priority level

#: ``priority(features, predicted)``: the value for one request (``predicted``: its decision's predictions, or None)
PriorityFn = Callable[[RequestFeatures, Mapping[str, float] | None], int]


def make_priority(options: EnginePriorityConfig, clock: Callable[[], float] = time.time) -> PriorityFn:
    """``priority(features, predicted)``: the value to send, from the request's features and its decision's
    ``predicted`` mapping (``workflow_remaining_tokens`` is read when ``tokens_per_level`` is set)."""
    per_age = SCALE / options.aging_s
    per_token = SCALE / options.tokens_per_level if options.tokens_per_level else 0.0

    def priority(features: RequestFeatures, predicted: Mapping[str, float] | None = None) -> int:
        value = SCALE * features.priority + clock() * per_age
        if per_token and predicted:
            remaining = predicted.get("workflow_remaining_tokens")
            if remaining is not None and remaining > 0:
                value += remaining * per_token
        return round(value)

    return priority
