"""The predictive, Chimera-style policy: route by predicted latency, then by predicted quality.

For every eligible worker the predictor (captured at construction, in a :class:`ModelSlot` that a
background refit may swap) gives p90 TTFT / TPOT / e2e and the probability of a good answer. The
rule is SLA-aware: among the workers predicted to meet the request's SLA (``ttft_slo_ms``,
``tpot_slo_ms``, ``e2e_slo_ms``; predictions divided by each worker's ``time_scale``, since SLOs are
in modelled time) and the agent's ``min_quality``, it prefers the highest predicted quality; the
``latency_slack`` (Chimera's "most capable within slack x the fastest's p90 e2e") only breaks ties
among candidates of similar quality (within :data:`QUALITY_BAND` of the best), and is the whole rule
when no SLA is set. If nobody meets the SLA, the least predicted lateness wins. The rest of the
ranking (retry fallbacks) follows the same order.

Prefix affinity enters as the expected cached share of the prompt on each worker (lower predicted
TTFT there), with a load guard: a worker carrying more than ``affinity_load_ratio`` x the least
loaded candidate's in-flight requests (+ ``affinity_load_slack``) gets no affinity credit, so a hot
prefix cannot pile every workflow onto one worker.

The policy is a pure synchronous function of ``(features, snapshot)``: no I/O, no fitting; it never
reads the simulator-only ``sim`` field (the gateway does not pass it).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from predictor.boosting import Array
from predictor.model import ModelSlot, Prediction, PriorPredictor
from predictor.prior import WorkerProfile, profiles_by_model
from router.config import PolicyOptions
from router.types import BackendView, Decision, FleetSnapshot, Policy, RequestFeatures


def guarded_shares(features: RequestFeatures, views: tuple[BackendView, ...], options: PolicyOptions) -> Array:
    """Each worker's expected cached share, zeroed where the load guard says the worker is too busy."""
    hits = features.prefix_hits
    shares = np.asarray([hits.get(v.name, 0.0) for v in views], dtype=np.float64)
    if not shares.any():
        return shares
    load = np.asarray([v.inflight_requests for v in views], dtype=np.float64)
    limit = options.affinity_load_ratio * load.min() + options.affinity_load_slack
    return np.where(load > limit, 0.0, shares)


QUALITY_BAND = 0.2  # candidates within this of the best predicted quality count as "similar quality"


def rank(p: Prediction, features: RequestFeatures, slack: float, scale: Array | None = None) -> tuple[list[int], str]:
    """Candidate indices, best first, and why the first was chosen.

    ``scale``: each worker's ``time_scale`` (wall seconds per modelled second); SLOs are in modelled
    time, so predictions are divided by it before they are compared with them. (Plain Python over the
    few candidates: cheaper than a dozen numpy calls on 8-element arrays.)
    """
    k = 1e3 if scale is None else 1e3 / scale
    ttft90: list[float] = (p.ttft[:, 1] * k).tolist()
    tpot90: list[float] = (p.tpot[:, 1] * k).tolist()
    e2e90: list[float] = (p.e2e[:, 1] * k).tolist()
    quality: list[float] = p.quality.tolist()
    n = len(e2e90)
    slos = [(v, s) for v, s in ((ttft90, features.ttft_slo_ms), (tpot90, features.tpot_slo_ms),
                                (e2e90, features.e2e_slo_ms)) if s is not None]  # fmt: skip
    mq = features.min_quality
    late = [sum(max(0.0, v[i] - s) / s for v, s in slos) + (max(0.0, mq - quality[i]) if mq is not None else 0.0)
            for i in range(n)]  # fmt: skip
    ok = [i for i in range(n) if late[i] <= 0.0]
    if not ok:
        return sorted(range(n), key=lambda i: (late[i], e2e90[i])), "least_late"
    has_sla = bool(slos)
    # With an SLA: the best predicted quality among those meeting it; the slack picks among similar
    # quality (within QUALITY_BAND of the best). Without one: Chimera's rule over every candidate.
    if has_sla:
        top = max(quality[i] for i in ok)
        pool = [i for i in ok if quality[i] >= top - QUALITY_BAND]
    else:
        pool = ok
    fastest = min(e2e90[i] for i in pool)
    best = min((i for i in pool if e2e90[i] <= slack * fastest), key=lambda i: (-quality[i], e2e90[i]))
    # Fallbacks: other SLA-meeting workers by quality then e2e (or by e2e without an SLA), then the
    # rest by lateness.
    rest_ok = sorted(
        (i for i in ok if i != best), key=(lambda i: (-quality[i], e2e90[i])) if has_sla else e2e90.__getitem__
    )
    rest_bad = sorted((i for i in range(n) if late[i] > 0.0), key=lambda i: (late[i], e2e90[i]))
    why = "fastest" if best == min(ok, key=e2e90.__getitem__) else ("quality" if has_sla else "slack")
    return [best, *rest_ok, *rest_bad], why


def make_predictive(
    options: PolicyOptions,
    slot: ModelSlot | None = None,
    profiles: Mapping[str, WorkerProfile] | None = None,
) -> Policy:
    """The policy over ``slot`` (default: a prior-only predictor) and the workers' ``profiles`` by
    backend name (default: guessed from each worker's model name)."""
    slot = slot or ModelSlot(PriorPredictor())
    profiles = dict(profiles or {})
    slack = options.latency_slack

    def predictive(features: RequestFeatures, snapshot: FleetSnapshot) -> Decision:
        views = snapshot.backends
        if not views:
            return Decision(ranked=())
        worker_profiles = profiles_by_model(profiles, views)
        p = slot.current.predict(features, views, worker_profiles, guarded_shares(features, views, options))
        scale = np.fromiter((w.time_scale for w in worker_profiles), np.float64, len(views))
        order, why = rank(p, features, slack, scale)
        i = order[0]
        predicted = {
            "ttft_ms": float(p.ttft[i, 0] * 1e3), "ttft_p90_ms": float(p.ttft[i, 1] * 1e3),
            "tpot_ms": float(p.tpot[i, 0] * 1e3), "e2e_ms": float(p.e2e[i, 0] * 1e3),
            "e2e_p90_ms": float(p.e2e[i, 1] * 1e3), "quality": float(p.quality[i]),
            "output_tokens": float(p.output[i, 0]), "output_tokens_p90": float(p.output[i, 1]),
            "workflow_remaining_tokens": float(p.remaining[i]),
        }  # fmt: skip
        return Decision(ranked=tuple(views[j].name for j in order), reason=f"predictive:{why}", predicted=predicted)

    return predictive
