"""Learning answer quality and length from outcome files (:mod:`predictor.outcomes`), and judging them on prompts
the model never saw.

Each (prompt, model) of an outcome file becomes a :class:`Sample` as a gateway would log it for a chat whose user
message is the prompt: the features a gateway computes before dispatch (:mod:`predictor.sketch`: the hashed sketch
and task terms; the prompt's length), the model as its worker, the verdict as its score, the answer's length as its
output tokens, and no latency (left to the prior). The task is the sample's agent, as each task has an agent of its
own in a deployment (a coder, a solver): the quality model fits one regression per task and one pooled over all,
which answers for a task it never saw. The result is the same :class:`Predictor` a gateway loads.

:func:`cross_validate` fits on k-1 folds of the prompts and judges on the held-out fold, per model: ROC AUC, Brier
score and expected calibration error of P(correct); the p50 answer length's mean absolute percentage error and its
Kendall tau against the real lengths.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.stats import kendalltau
from sklearn.metrics import brier_score_loss, roc_auc_score
from sklearn.model_selection import GroupKFold

from predictor.model import Predictor, Sample, quality_extras
from predictor.outcomes import Outcome
from predictor.prior import WorkerProfile, profile_for
from predictor.quality import QualityModel, term_matrix
from predictor.sketch import task_text, text_features
from router.core.types import BackendView, RequestFeatures

CHARS_PER_TOKEN = 4.0  # a prompt's length where the file does not give it (English text in a BPE vocabulary)
ECE_BINS = 10
C_GRID = (0.01, 0.03, 0.1, 0.5)  # the quality model's regularisation, chosen among by cross-validation


def only(outcomes: Sequence[Outcome], models: Sequence[str]) -> list[Outcome]:
    """``outcomes`` with only ``models``' answers (prompts none of them answered left out)."""
    keep = set(models)
    out = [dataclasses.replace(o, answers={m: a for m, a in o.answers.items() if m in keep}) for o in outcomes]
    return [o for o in out if o.answers]


def features_of(o: Outcome) -> RequestFeatures:
    """What a gateway sees of a chat whose user message is ``o``'s prompt, sent by ``o``'s task's agent."""
    payload = {"messages": [{"role": "user", "content": o.prompt}]}
    sketch, terms = text_features("user " + o.prompt, task_text("chat", payload))
    tokens = o.prompt_tokens or max(1, round(len(o.prompt) / CHARS_PER_TOKEN))
    return RequestFeatures(agent=o.task, endpoint="chat", models=tuple(o.answers), prompt_tokens=tokens,
                           max_tokens=None, stream=False, sketch=sketch, terms=terms)  # fmt: skip


def worker(model: str) -> tuple[BackendView, WorkerProfile]:
    """An idle worker of ``model`` (named after it) and the profile it is priced with."""
    return BackendView(name=model, model=model), profile_for(None, model)


def samples_of(outcomes: Sequence[Outcome]) -> list[Sample]:
    out = []
    for o in outcomes:
        f = features_of(o)
        for model, a in o.answers.items():
            view, profile = worker(model)
            out.append(Sample(f, view, profile, None, None, None, a.output_tokens, None, a.score))
    return out


def fit(outcomes: Sequence[Outcome], predictor: Predictor | None = None) -> Predictor:
    """``predictor`` fitted on every answer of ``outcomes``; by default a new one whose quality model's
    regularisation is chosen by cross-validation on these prompts alone (:func:`choose_c`)."""
    samples = samples_of(outcomes)
    if predictor is None:
        predictor = Predictor(calibration=0.0, quality=QualityModel(C=choose_c(samples)))
    return predictor.fit(samples)


def choose_c(samples: Sequence[Sample], grid: Sequence[float] = C_GRID, folds: int = 3) -> float:
    """The quality model's ``C`` of ``grid`` with the least log loss on the answers to prompts held out of each
    fit (``folds`` folds of the prompts): how much the words may say is a property of the data, not a constant
    (a few hundred verdicts from a gateway's own traffic want more freedom than thousands of varied prompts)."""
    rated = [s for s in samples if s.score is not None]
    if len({id(s.features) for s in rated}) < 2 * folds:
        return float(QualityModel().C)
    n_terms = QualityModel().n_terms
    extras = np.asarray([quality_extras(s.features) for s in rated])
    X = term_matrix([s.features.terms for s in rated], extras, n_terms)
    y = np.asarray([s.score for s in rated], dtype=np.float64)
    models = np.asarray([s.view.model for s in rated], dtype=object)
    agents = np.asarray([s.features.agent for s in rated], dtype=object)
    prompt = np.asarray([id(s.features) for s in rated])
    losses = []
    for c in grid:
        loss = 0.0
        for train, test in GroupKFold(n_splits=folds).split(X, groups=prompt):
            q = QualityModel(C=c).fit(X[train], y[train], models=models[train], groups=agents[train])
            for i in test:
                s = rated[i]
                p = q.predict_proba(s.features.terms, extras[i], s.features.agent, (s.view.model,),
                                    np.asarray([s.profile.quality]))[0]  # fmt: skip
                p = min(max(p, 1e-6), 1 - 1e-6)
                loss -= y[i] * np.log(p) + (1 - y[i]) * np.log(1 - p)
        losses.append(loss)
    return float(grid[int(np.argmin(losses))])


def predicted(estimator: Any, outcomes: Sequence[Outcome], models: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(P(correct), p50 answer tokens), each ``(len(outcomes), len(models))``."""
    workers = [worker(m) for m in models]
    views, profiles = tuple(v for v, _ in workers), tuple(p for _, p in workers)
    quality = np.empty((len(outcomes), len(models)))
    length = np.empty((len(outcomes), len(models)))
    for i, o in enumerate(outcomes):
        p = estimator.predict(features_of(o), views, profiles)
        quality[i], length[i] = p.quality, p.output[:, 0]
    return quality, length


def scores(outcomes: Sequence[Outcome], models: Sequence[str], quality: np.ndarray,
           length: np.ndarray) -> dict[str, dict[str, float | None]]:  # fmt: skip
    """Per model: ``auc``, ``brier``, ``ece``, ``length_mape``, ``length_tau`` and ``n`` over the prompts it
    answered (None where undefined: one class only)."""
    out: dict[str, dict[str, float | None]] = {}
    for j, m in enumerate(models):
        rows = [i for i, o in enumerate(outcomes) if m in o.answers]
        y = np.asarray([outcomes[i].answers[m].score for i in rows]) >= 0.5
        p = np.clip(quality[rows, j], 0.0, 1.0)
        real = np.asarray([outcomes[i].answers[m].output_tokens for i in rows], dtype=np.float64)
        guess = length[rows, j]
        two = 0 < y.sum() < len(y)
        tau = kendalltau(guess, real).statistic if len(rows) > 1 else None
        out[m] = {
            "n": len(rows),
            "auc": _round(roc_auc_score(y, p)) if two else None,
            "brier": _round(brier_score_loss(y, p)) if rows else None,
            "ece": _round(expected_calibration_error(y, p)) if rows else None,
            "length_mape": _round(float(np.mean(np.abs(guess - real) / real))) if rows else None,
            "length_tau": _round(tau) if tau is not None and np.isfinite(tau) else None,
        }
    return out


def expected_calibration_error(y: np.ndarray, p: np.ndarray, bins: int = ECE_BINS) -> float:
    """The mean |observed rate - predicted probability| over equal-width bins of ``p``, weighted by their counts."""
    which = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            total += inside.sum() * abs(float(y[inside].mean()) - float(p[inside].mean()))
    return total / max(1, len(p))


def cross_validate(outcomes: Sequence[Outcome], folds: int = 5, predictor: Predictor | None = None,
                   ) -> tuple[dict[str, dict[str, float | None]], np.ndarray, np.ndarray, list[str]]:  # fmt: skip
    """Fitted on ``folds - 1`` folds of the prompts, judged on the one held out, each fold in turn: the per-model
    :func:`scores`, and the held-out P(correct) and p50 lengths of every prompt and model (``models``' order)."""
    models = sorted({m for o in outcomes for m in o.answers})
    quality = np.empty((len(outcomes), len(models)))
    length = np.empty((len(outcomes), len(models)))
    splitter = GroupKFold(n_splits=folds)
    for train, test in splitter.split(np.arange(len(outcomes)), groups=[o.id for o in outcomes]):
        model = fit([outcomes[i] for i in train], predictor)  # (its choices made on the training prompts alone)
        quality[test], length[test] = predicted(model, [outcomes[i] for i in test], models)
    return scores(outcomes, models, quality, length), quality, length, models


def _round(v: float) -> float:
    return round(float(v), 4)


def model_size_b(name: str) -> float | None:
    """A model's size in billions of parameters as its name says it (``Qwen2.5-72B-Instruct``: 72), else None."""
    m = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z])", name)
    return float(m.group(1)) if m else None


def frontier(outcomes: Sequence[Outcome], models: Sequence[str], quality: np.ndarray, length: np.ndarray,
             points: int = 41) -> dict[str, Any]:  # fmt: skip
    """Success against mean cost per answer — cost: the model's size (B parameters) x its answer's tokens, in
    B-parameter-tokens; the real tokens for what was served, the predicted p50 for choosing — over the prompts every
    one of ``models`` answered (each needs a size in its name):

    ``single``: each model alone; ``oracle``: the cheapest model that answers right (the cheapest at all where none
    does); ``router``: per prompt the model with the most P(correct) - lambda x predicted cost, as lambda sweeps
    ``points`` values from 0 (a success at any price) up; ``random``: at each single model's cost, the success of
    sending each prompt to one of two models at random in the mix that costs that much (the single models'
    chord); ``recovered``: at each single model's cost, the share of the gap between the best of single models and
    random mixes there and the oracle that the router closes; ``reaches_best``: the least cost at which the router
    is at least 99 % as successful as the most successful single model, and that cost as a share of its."""
    sizes = [model_size_b(m) for m in models]
    cols = [j for j, s in enumerate(sizes) if s is not None]
    rows = [i for i, o in enumerate(outcomes) if all(models[j] in o.answers for j in cols)]
    if len(cols) < 2 or not rows:
        return {}
    names = [models[j] for j in cols]
    size = np.asarray([sizes[j] for j in cols], dtype=np.float64)
    right = np.asarray([[outcomes[i].answers[m].score >= 0.5 for m in names] for i in rows])
    cost = np.asarray([[outcomes[i].answers[m].output_tokens for m in names] for i in rows]) * size / 1000.0
    p, guess = quality[np.ix_(rows, cols)], length[np.ix_(rows, cols)] * size / 1000.0
    single = {m: (float(right[:, k].mean()), float(cost[:, k].mean())) for k, m in enumerate(names)}
    cheapest_right = np.where(right, cost, np.inf).argmin(axis=1)
    pick = np.where(right.any(axis=1), cheapest_right, cost.argmin(axis=1))
    at = np.arange(len(rows))
    oracle = (float(right[at, pick].mean()), float(cost[at, pick].mean()))
    scale = float(np.median(guess)) or 1.0
    curve = []
    for lam in np.concatenate([[0.0], np.geomspace(1e-3, 10.0, points - 1)]) / scale:
        choice = (p - lam * guess).argmax(axis=1)
        curve.append((float(right[at, choice].mean()), float(cost[at, choice].mean()), float(lam)))
    curve.sort(key=lambda c: c[1])
    hull = _chord(sorted(single.values(), key=lambda v: v[1]))

    def router_at(c: float) -> float:  # the most success the router has at no more than cost c
        return max((s for s, k, _ in curve if k <= c * (1 + 1e-9)), default=float("nan"))

    recovered = {}
    for m, (_, c_m) in single.items():
        base = hull(c_m)
        recovered[m] = _share(router_at(c_m) - base, oracle[0] - base)
    best_s, best_c = max(single.values())
    reach = min((k for s, k, _ in curve if s >= 0.99 * best_s), default=None)
    return {
        "cost": "model size (B parameters) x answer tokens / 1000",
        "prompts": len(rows),
        "single": {m: {"success": _round(s), "cost": _round(c)} for m, (s, c) in single.items()},
        "oracle": {"success": _round(oracle[0]), "cost": _round(oracle[1])},
        "router": [{"success": _round(s), "cost": _round(k), "lambda": _round(lam)} for s, k, lam in curve],
        "random": {m: _round(hull(c)) for m, (_, c) in single.items()},
        "router_at": {m: _round(router_at(c)) for m, (_, c) in single.items()},
        "recovered": recovered,
        "reaches_best": None if reach is None else {"cost": _round(reach), "share_of_its_cost": _round(reach / best_c)},
    }


def _chord(points: list[tuple[float, float]]) -> Callable[[float], float]:
    """Success at cost c of a random mix of two single models (the upper hull of (cost, success) points)."""
    hull: list[tuple[float, float]] = []
    for s, c in sorted(points, key=lambda v: v[1]):
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], (c, s)) >= 0:
            hull.pop()
        hull.append((c, s))

    def at(c: float) -> float:
        if c <= hull[0][0]:
            return hull[0][1]
        for (c0, s0), (c1, s1) in itertools.pairwise(hull):
            if c <= c1:
                return s0 + (s1 - s0) * (c - c0) / (c1 - c0) if c1 > c0 else max(s0, s1)
        return max(s for _, s in hull)

    return at


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _share(got: float, room: float) -> float | None:
    return None if room <= 0 or not np.isfinite(got) else _round(got / room)
