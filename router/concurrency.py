"""Adaptive admission (``gateway.admission.adaptive``): each worker's load limit, moved by feedback.

The static rule admits while a worker's *reserved* tokens (prompt + ``max_tokens`` or the predicted answer, per
request) stay under ``kv_full_ratio`` of its budget: a ratio fixed ahead, the same for every worker and every load,
and reservations are upper bounds (most answers stop before ``max_tokens``), so a worker at the ratio may hold far
less KV than it could, or, where answers run longer than predicted, more. The adaptive rule gives each worker its
own ratio and moves it by what the worker says about itself, as the second seed's Open-AutoGLM steers each server
toward a target utilisation:

- **KV use above** ``target_kv_usage`` (the worker's own scraped gauge): the ratio is cut in proportion,
  x target / use;
- **requests waiting in its own queue**: the ratio falls by ``DECREASE``;
- **TTFT over** ``ttft_tolerance`` x **its idle value** (the least TTFT average seen on it, which drifts up slowly
  so a worker that got slower for good is re-learnt): the ratio falls by ``TTFT_DECREASE``;
- otherwise, where the ratio binds (the request at hand, or the reservations carried, fill it), it grows by half
  the room left under the KV target, so reservations may exceed the budget where the KV they really hold stays
  under the target.

One step per ``update_s`` per worker (a fresh scrape's worth: between scrapes the gauges say nothing new). The
excess waits at the gateway in the priority queue (:mod:`router.admission`), where it still goes to whichever worker
frees up first, instead of in one worker's first-come-first-served queue; degraded requests (a smaller
``max_tokens``) still reserve less, and less urgent priorities still fill less of the ratio.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from router.core.types import BackendView

MIN_RATIO, MAX_RATIO = 0.05, 4.0  # a worker's ratio of reserved tokens to its KV budget stays within these
DECREASE = 0.8  # the ratio's factor while the worker queues requests itself
TTFT_DECREASE = 0.9  # ... while its TTFT is over the tolerance
IDLE_DRIFT = 1.01  # the idle TTFT's factor per step (it follows a worker that got slower for good)
MAX_GROWTH = 1.5  # the most a ratio grows in one step
BINDING = 0.9  # the ratio binds where reservations fill this share of it


@dataclass(slots=True)
class WorkerLimit:
    ratio: float
    idle_ttft_s: float = math.inf
    updated_at: float = -math.inf
    why: str = "start"  # what moved it last: start | kv | queue | ttft | grow | hold


class AdaptiveLimits:
    """Every worker's ratio of reserved tokens to KV budget (``ratio(view, now)``), starting at ``start``; pure
    arithmetic on the views it is shown."""

    def __init__(self, start: float, target_kv_usage: float, ttft_tolerance: float, update_s: float,
                 moved: Callable[[str, float], None] | None = None) -> None:  # fmt: skip
        self.start = start
        self.target = target_kv_usage
        self.tolerance = ttft_tolerance
        self.update_s = update_s
        self.moved = moved  # told each new ratio (the gateway's chimera_admission_ratio gauge)
        self.workers: dict[str, WorkerLimit] = {}

    def ratio(self, v: BackendView, now: float, need: int = 0) -> float:
        """``v``'s ratio, moved one step if ``update_s`` has passed since the last; ``need``: the reserved tokens
        the worker would carry with the request at hand (the ratio binds where they do not fit)."""
        w = self.workers.get(v.name)
        if w is None:
            w = self.workers[v.name] = WorkerLimit(self.start)
        if now - w.updated_at >= self.update_s:
            before = w.ratio
            self._step(w, v, need)
            w.updated_at = now
            if self.moved is not None and w.ratio != before:
                self.moved(v.name, w.ratio)
        return w.ratio

    def current(self, name: str) -> float:
        """``name``'s ratio as it stands (``start`` before its first step); moves nothing."""
        w = self.workers.get(name)
        return self.start if w is None else w.ratio

    def _step(self, w: WorkerLimit, v: BackendView, need: int) -> None:
        kv, ttft = v.kv_usage, v.ttft_ewma_s
        if ttft is not None and ttft > 0:
            w.idle_ttft_s = min(w.idle_ttft_s * IDLE_DRIFT, ttft)
        if kv is not None and kv > self.target:
            ratio, w.why = w.ratio * self.target / kv, "kv"
        elif (v.waiting or 0) > 0:
            ratio, w.why = w.ratio * DECREASE, "queue"
        elif ttft is not None and ttft > self.tolerance * w.idle_ttft_s:
            ratio, w.why = w.ratio * TTFT_DECREASE, "ttft"
        elif v.kv_budget_tokens and max(need, v.inflight_tokens) > BINDING * w.ratio * v.kv_budget_tokens:
            room = 0.5 * (self.target - kv) / self.target if kv is not None else 0.1
            ratio, w.why = w.ratio * min(MAX_GROWTH, 1.0 + room), "grow"
        else:
            ratio, w.why = w.ratio, "hold"
        w.ratio = min(MAX_RATIO, max(MIN_RATIO, ratio))
