"""Per-agent token buckets for ``rpm`` / ``tpm`` rate limits, kept in this process.

Each agent has two buckets, requests and tokens, each holding at most one minute's allowance and
refilled continuously (``rpm / 60`` per second). A request takes from both at once or from neither;
when either is short, the answer is how long until both would hold enough (the Retry-After). A
request larger than a whole minute's allowance is clamped to it, so it passes once the bucket is
full instead of never. The Redis state runs the same arithmetic in one Lua call
(:data:`router.state.redis_lua.TAKE_TOKENS`) and falls back to this while Redis is unreachable.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def refill(level: float, cap: float, elapsed_s: float) -> float:
    return min(cap, level + max(0.0, elapsed_s) * cap / 60.0)


def shortfall_s(level: float, need: float, cap: float) -> float:
    """Seconds until a bucket of ``cap`` per minute at ``level`` holds ``need`` (0: it does now)."""
    return max(0.0, (min(need, cap) - level) * 60.0 / cap)


class TokenBuckets:
    """``take(agent, requests, tokens, rpm, tpm)`` → 0 when allowed, else seconds to wait."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float, float]] = {}  # agent -> (requests, tokens, at)

    def take(self, agent: str, requests: int, tokens: int, rpm: int | None, tpm: int | None) -> float:
        if rpm is None and tpm is None:
            return 0.0
        now = self._clock()
        r_cap, t_cap = float(rpm or 0), float(tpm or 0)
        r, t, at = self._buckets.get(agent, (r_cap, t_cap, now))
        r, t = refill(r, r_cap, now - at), refill(t, t_cap, now - at)
        wait = max(
            shortfall_s(r, requests, r_cap) if rpm else 0.0,
            shortfall_s(t, tokens, t_cap) if tpm else 0.0,
        )
        if wait == 0.0:
            r -= min(requests, r_cap) if rpm else 0.0
            t -= min(tokens, t_cap) if tpm else 0.0
        self._buckets[agent] = (r, t, now)
        return wait
