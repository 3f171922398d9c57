"""The predictive, Chimera-style policy: route by predicted latency, then by predicted quality.

For every eligible worker the predictor (captured at construction, in a :class:`ModelSlot` that a
background refit may swap) gives p90 TTFT / TPOT / e2e and the probability of a good answer. The
rule is SLA-aware and difficulty-aware: among the workers predicted to meet the request's SLA
(``ttft_slo_ms``, ``tpot_slo_ms``, ``e2e_slo_ms``; predictions divided by each worker's
``time_scale``, since SLOs are in modelled time) and the agent's ``min_quality``, it takes the least
*expected cost*: predicted e2e p50 plus the chance of a wrong answer times what a wrong answer costs
the workflow (``wrong_answer_s``, modelled seconds: the check that catches it, a retry round, the
risk that the task fails). With a per-prompt quality model this sends easy steps to fast small
models and hard ones to capable models — Chimera's slack rule, with the slack set by how much better
the capable model is *on this prompt*. ``wrong_answer_stage_s`` adds that much per stage of the
request's workflow (``x-workflow-stage``): a wrong answer late in a workflow costs more, since more
finished work rides on it and fewer retries are left (with the expected-cost rule only: the config
refuses it beside ``wrong_answer_s: 0``). ``wrong_answer_s: 0`` gives Chimera's plain rule (the
most capable within ``latency_slack`` x the fastest's p90 e2e). If nobody meets the SLA, the least
predicted lateness wins. With ``sla_miss_s`` the SLA is priced instead of enforced: every worker meeting
``min_quality`` competes, with ``P(miss) x sla_miss_s`` added to its expected cost. The rest of the ranking
(retry fallbacks) follows the same order.

Online feedback (``latency_feedback``, on by default): before ranking, each worker's predicted TTFT
is multiplied by its view's ``ttft_bias`` and the decode part of its e2e (and its TPOT) by its
``tpot_bias`` — observed ÷ predicted over that worker's recent streamed answers, which the gateway
keeps per worker (:mod:`router.state.table`). The decision reports the estimator's own TTFT and
decode time per token (``ttft_model_ms``, ``tpot_model_ms``) beside the corrected figures: those
are what the chosen worker's timings are compared with. A worker slower than its profile or the
learned model says (a GPU it shares, a slow boot, sampling costs the profile never saw) is then
priced as it runs, before any refit; expected costs that differ by a few percent (the 1.5B against
the 7B for a typical step on the H200 fleet) are decided by measurement, not by two guesses.

Prefix affinity enters as the expected cached share of the prompt on each worker (lower predicted
TTFT there), with a load guard: a worker carrying more than ``affinity_load_ratio`` x the least
loaded candidate's in-flight requests (+ ``affinity_load_slack``) gets no affinity credit, so a hot
prefix cannot pile every workflow onto one worker.

The policy is a pure synchronous function of ``(features, snapshot)``: no I/O, no fitting; it never
reads the simulator-only ``sim`` field (the gateway does not pass it).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping

import numpy as np

from predictor.boosting import Array
from predictor.model import ModelSlot, Prediction, PriorPredictor, with_feedback
from predictor.prior import WorkerProfile, profile_for, profiles_by_model
from predictor.sharing import DECODE_STRETCH, TTFT_STRETCH, Sharing, price, shared
from router.core.config import PolicyOptions
from router.core.types import BackendView, Decision, FleetSnapshot, Policy, RequestFeatures

MAX_STAGE = 16  # wrong_answer_stage_s counts at most this many stages (a runaway loop's cost stays bounded)
EDGE_WEIGHT = 0.3  # spread_margin: the weight of a candidate at the margin's edge (a tied one weighs 1)
MASK64 = (1 << 64) - 1
Z90 = 1.2815515655446004  # the standard normal's 90th percentile


def guarded_shares(features: RequestFeatures, views: tuple[BackendView, ...], options: PolicyOptions) -> Array:
    """Each worker's expected cached share, zeroed where the load guard says the worker is too busy.
    (Plain Python over the few candidates, like :func:`rank`.)"""
    hits = features.prefix_hits
    shares = [hits.get(v.name, 0.0) for v in views] if hits else [0.0] * len(views)
    if not any(shares):
        return np.asarray(shares, dtype=np.float64)
    load = [v.inflight_requests for v in views]
    limit = options.affinity_load_ratio * min(load) + options.affinity_load_slack
    return np.asarray([0.0 if n > limit else s for s, n in zip(shares, load, strict=True)], dtype=np.float64)


def spread_near_ties(order: list[int], costs: list[float], margin: float, u: float) -> list[int]:
    """``order`` (by ascending ``costs``) with its first place drawn among the candidates whose cost is within
    ``margin`` (a fraction) of the least: weight ``1 - (1 - EDGE_WEIGHT) x gap / margin`` for a relative gap
    ``gap``, so a tie is split evenly and a candidate at the margin's edge still gets ``EDGE_WEIGHT`` of a tied
    one's share. ``u`` in [0, 1) picks; the rest keep their order."""
    least = costs[0]
    if least <= 0.0:
        return order
    weights = []
    for c in costs:
        gap = c / least - 1.0
        if gap > margin:
            break
        weights.append(1.0 - (1.0 - EDGE_WEIGHT) * gap / margin)
    if len(weights) < 2:
        return order
    edges = list(itertools.accumulate(weights))
    j = min(bisect.bisect_right(edges, u * edges[-1]), len(edges) - 1)
    return [order[j], *order[:j], *order[j + 1 :]]


def draw(seq: int) -> float:
    """A uniform number in [0, 1) from the gateway's request counter: a fixed mix of its bits (SplitMix64), so
    the policy stays a pure function of its inputs while near-ties are split as by a fair draw."""
    z = (seq * 0x9E3779B97F4A7C15 + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


def rank(
    p: Prediction,
    features: RequestFeatures,
    slack: float,
    scale: Array | None = None,
    wrong_ms: float = 0.0,
    spread: float = 0.0,
    u: float = 0.0,
    extra: list[float] | None = None,
    miss_ms: float | None = None,
) -> tuple[list[int], str, float | None]:
    """Candidate indices, best first, why the first was chosen, and (under the expected-cost rule, with two or
    more candidates meeting the SLA) how much dearer the runner-up's expected cost is than the first's (negative
    where a near tie was drawn for the dearer one).

    Among the candidates predicted to meet the SLA and ``min_quality`` (all, without an SLA):
    ``wrong_ms`` > 0 — the least expected cost ``e2e p50 + (1 - quality) x wrong_ms`` (what a wrong
    answer costs the workflow: the check that catches it, a retry round, the risk that the task fails);
    ``wrong_ms`` = 0 — Chimera's rule, the most capable within ``slack`` x the fastest's p90 e2e. Then
    the other SLA-meeting candidates by the same key,
    then the rest by predicted lateness. With ``spread`` > 0 the first place is drawn (by ``u``) among the
    candidates within ``spread`` of the least expected cost (:func:`spread_near_ties`); under Chimera's rule,
    among the best's equals in quality within ``spread`` of its p90 e2e.

    ``scale``: each worker's ``time_scale`` (wall seconds per modelled second); SLOs are in modelled
    time, so predictions are divided by it before they are compared with them. ``extra``: what choosing each
    candidate costs other requests (modelled ms: its GPU neighbours slowed, :mod:`predictor.sharing`), added to
    the expected cost (to the p90 e2e under Chimera's rule), never to the SLA check. ``miss_ms`` (with
    ``wrong_ms`` > 0): the SLA is a price, not a constraint: every candidate meeting ``min_quality`` is ranked by
    its expected cost plus ``P(miss) x miss_ms`` (:func:`miss_probability`). (Plain Python over the
    few candidates: cheaper than a dozen numpy calls on 8-element arrays.)
    """
    k = 1e3 if scale is None else 1e3 / scale
    e2e90: list[float] = (p.e2e[:, 1] * k).tolist()
    quality: list[float] = p.quality.tolist()
    n = len(e2e90)
    slos = [(a, s) for a, s in ((p.ttft, features.ttft_slo_ms), (p.tpot, features.tpot_slo_ms),
                                (p.e2e, features.e2e_slo_ms)) if s is not None]  # fmt: skip
    mq = features.min_quality
    late = [0.0] * n  # each candidate's relative lateness summed over its SLOs, then the missing quality
    for a, s in slos:  # (a p90 is only scaled if its SLO is set)
        v = e2e90 if a is p.e2e else (a[:, 1] * k).tolist()
        late = [x + max(0.0, y - s) / s for x, y in zip(late, v, strict=True)]
    if mq is not None:
        late = [x + max(0.0, mq - q) for x, q in zip(late, quality, strict=True)]
    miss = None
    if miss_ms is not None and wrong_ms > 0.0 and slos:  # the SLA priced: only min_quality excludes
        miss = miss_probabilities(slos, k, n)
        ok = [i for i in range(n) if mq is None or quality[i] >= mq]
    else:
        ok = [i for i in range(n) if late[i] <= 0.0]
    if not ok:
        return sorted(range(n), key=lambda i: (late[i], e2e90[i])), "least_late", None
    kept = set(ok)
    rest_bad = sorted((i for i in range(n) if i not in kept), key=lambda i: (late[i], e2e90[i]))
    if extra is not None:
        e2e90 = [x + y for x, y in zip(e2e90, extra, strict=True)]  # (the SLA check above used the request's own)
    fastest = min(ok, key=e2e90.__getitem__)
    if wrong_ms > 0.0:
        e2e50: list[float] = (p.e2e[:, 0] * k).tolist()
        if extra is not None:
            e2e50 = [x + y for x, y in zip(e2e50, extra, strict=True)]
        cost = {i: e2e50[i] + (1.0 - quality[i]) * wrong_ms for i in ok}
        if miss is not None and miss_ms is not None:
            cost = {i: c + miss[i] * miss_ms for i, c in cost.items()}
        order = sorted(ok, key=cost.__getitem__)
        costs = [cost[i] for i in order]
        if spread > 0.0 and len(order) > 1:
            order = spread_near_ties(order, costs, spread, u)
        why = "fastest" if order[0] == fastest else "quality"
        first = cost[order[0]]
        gap = cost[order[1]] / first - 1.0 if len(order) > 1 and first > 0.0 else None
        return [*order, *rest_bad], why, gap
    limit = slack * e2e90[fastest]
    best = min((i for i in ok if e2e90[i] <= limit), key=lambda i: (-quality[i], e2e90[i]))
    if spread > 0.0:  # workers as capable as the best (replicas of its model) share by their p90 e2e
        peers = sorted((i for i in ok if e2e90[i] <= limit and quality[i] == quality[best]), key=e2e90.__getitem__)
        best = spread_near_ties(peers, [e2e90[i] for i in peers], spread, u)[0]
    rest_ok = sorted((i for i in ok if i != best), key=e2e90.__getitem__)
    return [best, *rest_ok, *rest_bad], ("fastest" if best == fastest else "slack"), None


def miss_probability(p50: float, p90: float, slo: float) -> float:
    """P(the latency exceeds ``slo``) for a lognormal latency of median ``p50`` and 90th percentile ``p90``."""
    if p50 <= 0.0:
        return 0.0
    if p90 <= p50 * (1.0 + 1e-9):
        return 1.0 if p50 > slo else 0.0
    z = math.log(slo / p50) * Z90 / math.log(p90 / p50)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def miss_probabilities(slos: list[tuple[Array, float]], k: Array | float, n: int) -> list[float]:
    """Each candidate's P(missing any of ``slos``: (predicted p50/p90 in seconds, SLO in modelled ms)), the SLOs
    taken as independent; ``k``: ms per second of each candidate (1e3 / its time scale)."""
    hit = [1.0] * n
    for a, s in slos:
        p50, p90 = (a[:, 0] * k).tolist(), (a[:, 1] * k).tolist()
        hit = [h * (1.0 - miss_probability(x, y, s)) for h, x, y in zip(hit, p50, p90, strict=True)]
    return [1.0 - h for h in hit]


def gpu_sharing(
    raw: Prediction, views: tuple[BackendView, ...], worker_profiles: list[WorkerProfile], snapshot: FleetSnapshot,
    profiles: Mapping[str, WorkerProfile],
) -> Sharing | None:
    """How the candidates' GPU neighbours (in the whole fleet, any model) stretch and price them; None for
    workers alone on their GPUs (no ``gpu`` shared), at the cost of one scan of the candidates."""
    if not any(v.gpu for v in views):
        return None
    fleet = snapshot.everyone
    fleet_profiles = {u.name: profiles.get(u.name) or profile_for(None, u.model) for u in fleet if u.gpu is not None}
    ttft, tpot, e2e = raw.ttft[:, 0].tolist(), raw.tpot[:, 0].tolist(), raw.e2e[:, 0].tolist()
    return price(views, worker_profiles, ttft, tpot, e2e, fleet, fleet_profiles)


def make_predictive(
    options: PolicyOptions,
    slot: ModelSlot | None = None,
    profiles: Mapping[str, WorkerProfile] | None = None,
) -> Policy:
    """The policy over ``slot`` (default: a prior-only predictor) and the workers' ``profiles`` by
    backend name (default: guessed from each worker's model name). ``profiles`` is read, not copied, at every
    decision: the gateway's learner replaces the entries of workers that learn their own."""
    slot = slot or ModelSlot(PriorPredictor())
    profiles = profiles if profiles is not None else {}
    slack, wrong_ms, feedback = options.latency_slack, options.wrong_answer_s * 1e3, options.latency_feedback
    spread, miss_ms = options.spread_margin, (None if options.sla_miss_s is None else options.sla_miss_s * 1e3)
    stage_ms = options.wrong_answer_stage_s * 1e3

    def predictive(features: RequestFeatures, snapshot: FleetSnapshot) -> Decision:
        views = snapshot.backends
        if not views:
            return Decision(ranked=())
        worker_profiles = profiles_by_model(profiles, views)
        raw = slot.current.predict(features, views, worker_profiles, guarded_shares(features, views, options))
        sharing = gpu_sharing(raw, views, worker_profiles, snapshot, profiles)
        if sharing is not None:  # before the feedback: the biases measure what the stretch does not explain
            raw = shared(raw, sharing)
        p = (
            with_feedback(raw, views)
            if feedback and any(v.ttft_bias != 1.0 or v.tpot_bias != 1.0 for v in views)
            else raw
        )
        scale = np.fromiter((w.time_scale for w in worker_profiles), np.float64, len(views))
        stage = min(features.workflow_stage or 0, MAX_STAGE)  # the stage term needs the expected-cost rule:
        wrong = wrong_ms + stage_ms * stage if wrong_ms and stage > 0 else wrong_ms
        extra = None
        if sharing is not None:  # the neighbours' lost seconds, in modelled ms as the costs
            extra = [c * 1e3 / k for c, k in zip(sharing.neighbours_s, scale.tolist(), strict=True)]
        u = draw(features.seq) if spread else 0.0
        order, why, gap = rank(p, features, slack, scale, wrong, spread, u, extra, miss_ms)
        i = order[0]
        rows = (a[i].tolist() for a in (p.ttft, p.tpot, p.e2e, p.output))
        (ttft, ttft90), (tpot, _), (e2e, e2e90), (out, out90) = rows
        predicted = {
            "ttft_ms": ttft * 1e3, "ttft_p90_ms": ttft90 * 1e3, "tpot_ms": tpot * 1e3, "e2e_ms": e2e * 1e3,
            "e2e_p90_ms": max(e2e, e2e90) * 1e3, "quality": float(p.quality[i]), "output_tokens": out,
            "output_tokens_p90": out90, "workflow_remaining_tokens": float(p.remaining[i]),
        }  # fmt: skip
        if sharing is not None and (sharing.ttft[i] != 1.0 or sharing.decode[i] != 1.0):
            predicted[TTFT_STRETCH], predicted[DECODE_STRETCH] = sharing.ttft[i], sharing.decode[i]
        if extra is not None and extra[i]:
            predicted["gpu_neighbours_ms"] = extra[i]
        if len(order) > 1:  # the runner-up (the first fallback) and, under the expected cost, how much dearer
            j = order[1]
            predicted["runner_up_e2e_ms"] = float(p.e2e[j, 0]) * 1e3
            predicted["runner_up_quality"] = float(p.quality[j])
            if gap is not None:
                predicted["cost_gap"] = gap
        if feedback:  # the estimator's own TTFT and decode time per token, which the worker's timings correct
            ttft_raw, e2e_raw = float(raw.ttft[i, 0]), float(raw.e2e[i, 0])
            tpot_raw = (e2e_raw - ttft_raw) / (out - 1.0) if out > 1.5 and e2e_raw > ttft_raw else float(raw.tpot[i, 0])
            predicted["ttft_model_ms"], predicted["tpot_model_ms"] = ttft_raw * 1e3, tpot_raw * 1e3
        return Decision(ranked=tuple(views[j].name for j in order), reason=f"predictive:{why}", predicted=predicted)

    return predictive
