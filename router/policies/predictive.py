"""The predictive, Chimera-style policy: route by predicted latency, then by predicted quality.

For every eligible worker the predictor (captured at construction, in a :class:`ModelSlot` that a
background refit may swap) gives p90 TTFT / e2e and the probability of a good answer. Among the
workers that meet the request's SLA (``ttft_slo_ms``, ``e2e_slo_ms``) and the agent's
``min_quality``, it takes the most capable one whose p90 e2e is within ``latency_slack`` x the
fastest's (Chimera's rule); if none meets them, the least predicted lateness. The rest of the
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


def rank(p: Prediction, features: RequestFeatures, slack: float) -> tuple[list[int], str]:
    """Candidate indices, best first, and why the first was chosen."""
    ttft90, e2e90 = p.ttft[:, 1] * 1e3, p.e2e[:, 1] * 1e3
    meets = np.ones(len(ttft90), dtype=bool)
    if features.ttft_slo_ms is not None:
        meets &= ttft90 <= features.ttft_slo_ms
    if features.e2e_slo_ms is not None:
        meets &= e2e90 <= features.e2e_slo_ms
    if features.min_quality is not None:
        meets &= p.quality >= features.min_quality
    late = np.zeros(len(ttft90))
    if features.ttft_slo_ms is not None:
        late += np.maximum(0.0, ttft90 - features.ttft_slo_ms) / features.ttft_slo_ms
    if features.e2e_slo_ms is not None:
        late += np.maximum(0.0, e2e90 - features.e2e_slo_ms) / features.e2e_slo_ms
    if features.min_quality is not None:
        late += np.maximum(0.0, features.min_quality - p.quality)
    ok = np.flatnonzero(meets)
    if len(ok) == 0:
        order = np.lexsort((e2e90, late))
        return order.tolist(), "least_late"
    fastest = e2e90[ok].min()
    within = ok[e2e90[ok] <= slack * fastest]
    best = int(within[np.lexsort((e2e90[within], -p.quality[within]))[0]])
    # Fallbacks: other SLA-meeting workers by e2e, then the rest by lateness.
    rest_ok = [int(i) for i in ok[np.argsort(e2e90[ok], kind="stable")] if i != best]
    bad = np.flatnonzero(~meets)
    rest_bad = bad[np.lexsort((e2e90[bad], late[bad]))].tolist()
    return [best, *rest_ok, *rest_bad], "slack" if best != int(ok[np.argmin(e2e90[ok])]) else "fastest"


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
        p = slot.current.predict(features, views, profiles_by_model(profiles, views), guarded_shares(
            features, views, options))  # fmt: skip
        order, why = rank(p, features, slack)
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
