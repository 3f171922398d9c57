"""Load-balancing policies that need no model: round robin, least outstanding, least KV, length split."""

from __future__ import annotations

from collections.abc import Callable

from router.core.config import PolicyOptions
from router.core.types import BackendView, Decision, FleetSnapshot, Policy, RequestFeatures


def _ranked(backends: tuple[BackendView, ...] | list[BackendView], reason: str) -> Decision:
    return Decision(ranked=tuple(b.name for b in backends), reason=reason)


def round_robin(features: RequestFeatures, snapshot: FleetSnapshot) -> Decision:
    """Rotate through the eligible workers by the gateway's request counter."""
    bs = snapshot.backends
    if not bs:
        return Decision(ranked=())
    k = features.seq % len(bs)
    return _ranked(bs[k:] + bs[:k], "round_robin")


def _load_key(b: BackendView) -> tuple[float, ...]:
    # In-flight requests first; ties broken by reserved tokens relative to the worker's budget,
    # then by what the worker itself reports queued.
    return (
        b.inflight_requests,
        b.inflight_tokens / b.kv_budget_tokens if b.kv_budget_tokens else 0.0,
        b.waiting or 0,
    )


def _rotate_ties(
    order: list[BackendView], key: Callable[[BackendView], tuple[float, ...]], seq: int
) -> list[BackendView]:
    """Within each run of exactly equal keys, rotate by the request counter, so an idle (or evenly
    loaded) group shares traffic evenly instead of the first-listed worker taking every tie."""
    out: list[BackendView] = []
    i = 0
    while i < len(order):
        j = i + 1
        k = key(order[i])
        while j < len(order) and key(order[j]) == k:
            j += 1
        group = order[i:j]
        r = seq % len(group)
        out += group[r:] + group[:r]
        i = j
    return out


def least_outstanding(features: RequestFeatures, snapshot: FleetSnapshot) -> Decision:
    """Fewest in-flight requests (this gateway's own count, always fresh)."""
    order = sorted(snapshot.backends, key=_load_key)
    return _ranked(_rotate_ties(order, _load_key, features.seq), "least_outstanding")


def least_kv(features: RequestFeatures, snapshot: FleetSnapshot) -> Decision:
    """Lowest scraped KV-cache use; ties (and workers not yet scraped) by in-flight requests."""
    order = sorted(
        snapshot.backends,
        key=lambda b: (b.kv_usage if b.kv_usage is not None else 0.0, *_load_key(b)),
    )
    return _ranked(order, "least_kv")


def make_length_split(options: PolicyOptions) -> Policy:
    """The seeds' isolated pools: long prompts go to workers tagged ``options.long_tag``, short ones
    to the others; within a pool, least outstanding. The other pool is the fallback."""
    threshold, tag = options.long_prompt_tokens, options.long_tag

    def length_split(features: RequestFeatures, snapshot: FleetSnapshot) -> Decision:
        is_long = features.prompt_tokens >= threshold
        home = [b for b in snapshot.backends if (tag in b.tags) == is_long]
        away = [b for b in snapshot.backends if (tag in b.tags) != is_long]
        key = _load_key
        order = sorted(home, key=key) + sorted(away, key=key)
        return _ranked(order, "length_split:" + ("long" if is_long else "short"))

    return length_split
