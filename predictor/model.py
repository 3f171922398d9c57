"""The predictor a policy asks: per candidate worker, latency quantiles, output length and quality.

Two implementations of one ``predict(features, views, profiles, cached) -> Prediction``:

* :class:`PriorPredictor` — no learned state, the analytic prior (:mod:`predictor.prior`); what a
  gateway routes with before any training.
* :class:`Predictor` — a scikit-learn style composite estimator: ``fit(samples)`` fits the output
  length, latency and quality models (clones of its hyper-parameter sub-estimators) and falls back
  to the prior for whatever it could not learn (too few rows, no feedback).

Both predict for all candidates at once: two packed-forest calls and a few numpy operations.
:class:`ModelSlot` is the holder a policy captures: a background refit swaps ``slot.current``
atomically between decisions.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, clone
from sklearn.linear_model import Ridge
from sklearn.model_selection import cross_val_predict

from predictor.boosting import Array, require_fitted
from predictor.calibration import MIN_ROWS, conformal_factor, group_split, load_bucket, load_edges, mondrian_factors
from predictor.latency import QUALITY_COLUMN, LatencyModel, latency_matrix
from predictor.latency import TARGETS as LATENCY_TARGETS
from predictor.length import OutputLengthModel, length_matrix, length_row
from predictor.prior import (
    TPOT_P90_FACTOR,
    TTFT_P90_FACTOR,
    WorkerProfile,
    fingerprint,
    prior_latency,
    prior_output,
    worker_load,
)
from predictor.quality import QualityModel, term_matrix
from predictor.sketch import N_TERMS
from router.core.types import BackendView, RequestFeatures


@dataclass(frozen=True, slots=True)
class Prediction:
    """Per candidate (rows in the order of the views): ``[:, 0]`` p50, ``[:, 1]`` p90; seconds, tokens."""

    ttft: Array
    tpot: Array
    e2e: Array
    output: Array
    remaining: Array  # p50 tokens this request and its workflow's later stages will generate
    quality: Array  # P(good answer)


@dataclass(frozen=True, slots=True)
class Sample:
    """One finished request as training data: what was known at dispatch, and what happened."""

    features: RequestFeatures
    view: BackendView
    profile: WorkerProfile
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    output_tokens: int | None
    remaining_tokens: int | None = None
    score: float | None = None


def with_feedback(p: Prediction, views: Sequence[BackendView]) -> Prediction:
    """``p`` corrected by how each worker's recent requests ran against their predictions: TTFT times
    the view's ``ttft_bias``, the decode part of e2e (e2e - TTFT, at least 0) and TPOT times its
    ``tpot_bias``. A gateway learns these ratios online from every streamed answer
    (:mod:`router.state.table`), so a worker slower than its profile or the learned model says — a
    co-located GPU, a slow boot — is priced as it runs now, before any refit. (Few numpy calls: this
    runs in every decision.)"""
    b = np.array([(v.ttft_bias, v.tpot_bias) for v in views])
    bt, bp = b[:, :1], b[:, 1:]
    ttft = p.ttft * bt
    e2e = p.e2e - p.ttft
    np.maximum(e2e, 0.0, out=e2e)
    e2e *= bp
    e2e += ttft
    return Prediction(ttft, p.tpot * bp, e2e, p.output, p.remaining, p.quality)


class Estimator(Protocol):
    def predict(
        self,
        features: RequestFeatures,
        views: Sequence[BackendView],
        profiles: Sequence[WorkerProfile],
        cached: Array | None = None,
    ) -> Prediction: ...


class ModelSlot:
    """The current estimator; replaced whole by a refit (one attribute store, atomic for readers). ``profiles``:
    the workers' profiles by backend name that the estimator predicts with, where the gateway keeps them up to
    date (a worker with no profile learns its own: :mod:`predictor.online`); None: the policy resolves them."""

    def __init__(self, current: Estimator, profiles: dict[str, WorkerProfile] | None = None) -> None:
        self.current = current
        self.profiles = profiles
        self.version = 0

    def swap(self, estimator: Estimator) -> None:
        self.current = estimator
        self.version += 1


def cached_shares(features: RequestFeatures, views: Sequence[BackendView]) -> Array:
    hits = features.prefix_hits
    return np.asarray([hits.get(v.name, 0.0) for v in views], dtype=np.float64)


def _priors(f: RequestFeatures, views: Sequence[BackendView], profiles: Sequence[WorkerProfile],
            cached: Array) -> Array:  # fmt: skip
    rows = zip(profiles, views, cached.tolist(), strict=True)
    return np.asarray([prior_latency(p, v, f.prompt_tokens, c) for p, v, c in rows])


def _assemble(prior: Array, output: Array, remaining: Array, quality: Array, learned: Array | None) -> Prediction:
    """Fill what the learned models did not give (NaN) from the prior; keep p90 >= p50.

    ``learned``: ``(n, 3, 2)`` TTFT / TPOT / e2e x p50 / p90 (filled in place), or ``None``."""
    if learned is None:  # the prior alone: its p90s are p50 x factors > 1, so p90 >= p50 already
        ttft, tpot = prior[:, 0:1] * _TTFT_FACTORS, prior[:, 1:2] * _TPOT_FACTORS
        return Prediction(ttft, tpot, ttft + np.maximum(output - 1.0, 0.0) * tpot, output, remaining, quality)
    lat = learned
    # Which (target, quantile) are missing depends on which models were learned, not on the row.
    missing = np.isnan(lat[0]).tolist() if len(lat) else [[False, False]] * 3
    if any(missing[0]):
        lat[:, 0] = _fill(lat[:, 0], missing[0], prior[:, 0:1] * _TTFT_FACTORS)
    if any(missing[1]):
        lat[:, 1] = _fill(lat[:, 1], missing[1], prior[:, 1:2] * _TPOT_FACTORS)
    if any(missing[2]):  # e2e from TTFT and TPOT (as filled, before p90 >= p50 is enforced)
        lat[:, 2] = _fill(lat[:, 2], missing[2], lat[:, 0] + np.maximum(output - 1.0, 0.0) * lat[:, 1])
    lat[:, :, 1] = np.maximum(lat[:, :, 1], lat[:, :, 0])
    return Prediction(lat[:, 0], lat[:, 1], lat[:, 2], output, remaining, quality)


def _fill(learned: Array, missing: list[bool], fallback: Array) -> Array:
    return fallback if all(missing) else np.where(np.isnan(learned), fallback, learned)


_TTFT_FACTORS = np.asarray([1.0, TTFT_P90_FACTOR])
_PRIOR_OUTPUT = np.asarray(prior_output(None))
_TPOT_FACTORS = np.asarray([1.0, TPOT_P90_FACTOR])


class PriorPredictor:
    """Routing before any training: the analytic prior, the profile's quality — or, for an ``(agent, backend)`` in
    ``quality``, the quality the gateway has learned of that agent's answers there so far (a live mapping:
    :mod:`predictor.online`)."""

    def __init__(self, quality: Mapping[tuple[str, str], float] | None = None) -> None:
        self.quality = quality

    def predict(
        self,
        features: RequestFeatures,
        views: Sequence[BackendView],
        profiles: Sequence[WorkerProfile],
        cached: Array | None = None,
    ) -> Prediction:
        cached = cached_shares(features, views) if cached is None else cached
        out50, out90 = prior_output(features.max_tokens)
        output = np.tile([out50, out90], (len(views), 1))
        learned, agent = self.quality, features.agent
        if learned:
            pairs = zip(views, profiles, strict=True)
            quality = np.asarray([learned.get((agent, v.name), p.quality) for v, p in pairs])
        else:
            quality = np.asarray([p.quality for p in profiles])
        return _assemble(_priors(features, views, profiles, cached), output, output[:, 0].copy(), quality, None)


# What a decision needs from the learned models (the rest stays out of the hot path): the answer's
# length p50/p90 and the workflow's remaining output p50; TTFT and e2e p50/p90. TPOT comes from the
# prior (it is only reported and checked against a TPOT SLO; the prior's TPOT is within ~1 % MAPE).
# The remaining output is only reported too (logged for a future scheduler), but every request logs
# it: in this walk it costs ~3.5 us, in a walk of its own when read ~22 us.
LENGTH_SLOTS = ((0, 0), (0, 1), (1, 0))
LATENCY_SLOTS = ((0, 0), (0, 1), (2, 0), (2, 1))


TEXT_ALPHA = 300.0  # ridge penalty of the length read-out from task terms (held-out e2e MAPE 41 % at 3, 31 % here)
TEXT_MIN_SAMPLES = 50


def _code(vocab: tuple[str, ...], name: str) -> float:
    try:
        return float(vocab.index(name))
    except ValueError:
        return -1.0


class Predictor(BaseEstimator):  # type: ignore[misc]
    """Learned output length, latency and quality (see the module docstring).

    ``profiles_`` (fitted): each worker profile the training samples ran on, by name, with its
    :func:`~predictor.prior.fingerprint` (the gateway warns when its config's profile of a name differs).
    """

    def __init__(
        self,
        length: OutputLengthModel | None = None,
        latency: LatencyModel | None = None,
        quality: QualityModel | None = None,
        calibration: float = 0.25,
        load_bins: int = 3,
        load_targets: tuple[str, ...] = ("ttft",),
        random_state: int = 0,
    ) -> None:
        self.length = length
        self.latency = latency
        self.quality = quality
        self.calibration = calibration  # share of the training workflows held out to calibrate the p90s; 0: none
        self.load_bins = load_bins  # latency p90s calibrated per bucket of the worker's load (Mondrian); 1: pooled
        self.load_targets = load_targets  # which latency targets' p90s are (the rest: pooled)
        self.random_state = random_state  # which workflows are held out

    def fit(self, X: Sequence[Sample], y: Any = None) -> Self:
        samples = list(X)
        if not samples:
            raise ValueError("no training samples")
        self.__dict__.pop("_candidates_cache", None)  # codes of the previous fit's vocabulary
        # First the calibration (a copy fitted on part of the data), then the model on all of it.
        self.output_factor_, self.load_edges_, self.latency_shift_, self.latency_pooled_ = self._calibrate(samples)
        self.agents_ = tuple(sorted({s.features.agent for s in samples}))
        profiles = {s.profile.name: s.profile for s in samples}  # what the prior was built on: one digest per name
        self.profiles_ = {name: fingerprint(wp) for name, wp in profiles.items()}
        self.models_ = tuple(sorted({s.view.model for s in samples}))
        text_len = self._fit_text_length(samples)
        X_len = np.asarray([
            length_row(s.features, _code(self.agents_, s.features.agent), _code(self.models_, s.view.model), t)
            for s, t in zip(samples, text_len, strict=True)
        ])  # fmt: skip
        Y_len = np.asarray([[_nan(s.output_tokens), _nan(s.remaining_tokens)] for s in samples])
        self.length_ = clone(self.length if self.length is not None else OutputLengthModel()).fit(X_len, Y_len)
        output = self._output(self.length_.predict(X_len), _caps([s.features.max_tokens for s in samples]))
        rows = []
        for i, s in enumerate(samples):
            cached = np.asarray([s.features.prefix_hits.get(s.view.name, 0.0)])
            prior = _priors(s.features, (s.view,), (s.profile,), cached)
            rows.append(latency_matrix(s.features, (s.view,), (s.profile,), cached, output[i : i + 1], prior)[0])
        Y_lat = np.asarray([[_nan(s.ttft_s), _nan(s.tpot_s), _nan(s.e2e_s)] for s in samples])
        self.latency_ = clone(self.latency if self.latency is not None else LatencyModel()).fit(np.asarray(rows), Y_lat)
        rated = [s for s in samples if s.score is not None]
        quality = clone(self.quality if self.quality is not None else QualityModel())
        self.quality_ = quality.fit(
            term_matrix([s.features.terms for s in rated], np.asarray([quality_extras(s.features) for s in rated]),
                        quality.n_terms),
            np.asarray([s.score for s in rated]),
            models=[s.view.model for s in rated],
            groups=[s.features.agent for s in rated],
        )  # fmt: skip
        self.n_samples_ = len(samples)
        return self

    def _calibrate(self, samples: Sequence[Sample]) -> tuple[float, tuple[float, ...], Array, Array]:
        """Split-conformal factors of the upper quantiles (:mod:`predictor.calibration`): the output
        tokens' p90 factor; the load buckets' upper edges; ``(buckets, 3, 2)`` factors for TTFT / TPOT /
        e2e x p50 / p90 per load bucket (Mondrian; the same in every bucket for a target not in
        ``load_targets``); and the pooled ``(3,)`` latency p90 factors. 1.0 where not calibrated (the
        medians, targets with too few held-out rows; the remaining output's p90 is not reported)."""
        output_factor, edges = 1.0, ()
        latency_shift, pooled = np.ones((1, len(LATENCY_TARGETS), 2)), np.ones(len(LATENCY_TARGETS))
        if self.calibration <= 0.0:
            return output_factor, edges, latency_shift, pooled
        held = group_split([s.features.workflow_id for s in samples], self.calibration, self.random_state)
        if held.sum() < MIN_ROWS or (~held).sum() < MIN_ROWS:
            return output_factor, edges, latency_shift, pooled
        fit = [s for s, h in zip(samples, held, strict=True) if not h]
        cal = [s for s, h in zip(samples, held, strict=True) if h]
        sub, pred, actual = self._held_out_p90s(fit, cal)
        # Only what the copy learned: a target it left to the prior says nothing of the learned model's.
        if sub.length_.learned(0):
            output_factor = conformal_factor(actual[:, 0], pred[:, 0], sub.length_.quantiles[1])
        # The buckets' edges from the fitting rows, so that they do not depend on the calibration scores.
        bins = self.load_bins if set(self.load_targets) & set(LATENCY_TARGETS) else 1
        edges = tuple(load_edges(np.asarray([worker_load(s.view) for s in fit], dtype=np.float64), bins).tolist())
        buckets = load_bucket(np.asarray(edges), np.asarray([worker_load(s.view) for s in cal], dtype=np.float64))
        pooled_bucket = np.zeros_like(buckets)
        latency_shift = np.ones((len(edges) + 1, len(LATENCY_TARGETS), 2))
        for t, name in enumerate(LATENCY_TARGETS):
            if sub.latency_.learned(t):
                by_load = name in self.load_targets
                pooled[t], latency_shift[:, t, 1] = mondrian_factors(
                    actual[:, 1 + t], pred[:, 1 + t], buckets if by_load else pooled_bucket,
                    len(edges) + 1 if by_load else 1, sub.latency_.quantiles[1],
                )  # fmt: skip
        return output_factor, edges, latency_shift, pooled

    def _held_out_p90s(self, fit: Sequence[Sample], cal: Sequence[Sample]) -> tuple[Predictor, Array, Array]:
        """(an uncalibrated copy fitted on ``fit``, its output / TTFT / TPOT / e2e upper quantiles for the
        ``cal`` requests, what they actually were), ``(len(cal), 4)`` each."""
        sub = clone(self).set_params(calibration=0.0).fit(fit)
        pred = np.full((len(cal), 4), np.nan)
        for i, s in enumerate(cal):
            p = sub.predict(s.features, (s.view,), (s.profile,), full=True)
            pred[i] = p.output[0, 1], p.ttft[0, 1], p.tpot[0, 1], p.e2e[0, 1]
        actual = np.asarray([[_nan(s.output_tokens), _nan(s.ttft_s), _nan(s.tpot_s), _nan(s.e2e_s)] for s in cal])
        return sub, pred, actual.reshape(len(cal), 4)

    def _text_rows(self, feats: Sequence[RequestFeatures]) -> Any:
        onehot = np.asarray([[f.agent == a for a in self.agents_] for f in feats], dtype=np.float64)
        return term_matrix([f.terms for f in feats], onehot.reshape(len(feats), len(self.agents_)), N_TERMS)

    def _fit_text_length(self, samples: Sequence[Sample]) -> Array:
        """A ridge regression of log(answer tokens) on the task terms + agent (Chimera's length predictor
        reads the prompt); returns its *out-of-fold* predictions for the training rows, so the trees that
        take it as a feature do not learn to over-trust an in-sample fit."""
        X = self._text_rows([s.features for s in samples])
        y = np.asarray([math.log(s.output_tokens) if s.output_tokens else math.nan for s in samples])
        has = np.isfinite(y) & np.asarray([len(s.features.terms) > 0 for s in samples])
        self.text_coef_ = np.zeros(X.shape[1])
        self.text_intercept_ = math.nan
        out = np.full(len(samples), -1.0)
        if has.sum() < TEXT_MIN_SAMPLES:
            return out
        ridge = Ridge(alpha=TEXT_ALPHA)
        out[has] = cross_val_predict(ridge, X[has], y[has], cv=5)
        fitted = ridge.fit(X[has], y[has])
        self.text_coef_, self.text_intercept_ = fitted.coef_.astype(np.float64), float(fitted.intercept_)
        return out

    def _text_length(self, f: RequestFeatures, t: npt.NDArray[np.int64], valid: npt.NDArray[np.int64]) -> float:
        """The ridge read-out for ``f`` whose term ids are ``t`` (``valid``: those in range); -1 without
        terms or a fit."""
        if not len(t) or not math.isfinite(getattr(self, "text_intercept_", math.nan)):
            return -1.0
        z = self.text_coef_[valid].sum() + self.text_intercept_
        if f.agent in self.agents_:
            z += self.text_coef_[N_TERMS + self.agents_.index(f.agent)]
        return float(z)

    def _output(self, pred: Array, caps: Array | float) -> Array:
        """This request's output p50/p90 from the length model's ``(n, targets, quantiles)``; ``caps``:
        each row's ``max_tokens`` (inf: none), or one for every row."""
        out = pred[:, 0, :]
        if np.isnan(out).any():  # the length model was not learned: the prior's defaults
            out = np.where(np.isnan(out), _PRIOR_OUTPUT, out)
        out = np.minimum(out, caps if isinstance(caps, float) else caps[:, None])
        out[:, 1] = np.maximum(out[:, 1], out[:, 0])
        return out

    def predict(
        self,
        features: RequestFeatures,
        views: Sequence[BackendView],
        profiles: Sequence[WorkerProfile],
        cached: Array | None = None,
        *,
        full: bool = False,
    ) -> Prediction:
        """``full``: every learned model (TPOT included), as ``chimera predictor eval`` scores them; by
        default only what a decision needs (:data:`LENGTH_SLOTS`, :data:`LATENCY_SLOTS`)."""
        require_fitted(self, "latency_")
        cached = cached_shares(features, views) if cached is None else cached
        models = tuple(v.model for v in views)
        codes, rows = self._candidates(models)  # candidates of one model share a length prediction
        terms = np.fromiter(features.terms, np.int64, len(features.terms))
        valid = terms[(terms >= 0) & (terms < N_TERMS)]  # once, for the length read-out and quality
        text_len = self._text_length(features, terms, valid)
        X_len = length_matrix(features, _code(self.agents_, features.agent), codes, text_len)
        pred = self.length_.predict(X_len, None if full else LENGTH_SLOTS)[rows]
        cap = float(features.max_tokens) if features.max_tokens else math.inf
        output = self._output(pred, cap)  # uncalibrated: what the latency model was trained on
        prior = _priors(features, views, profiles, cached)
        X_lat = latency_matrix(features, views, profiles, cached, output, prior)
        learned = self.latency_.predict(X_lat, None if full else LATENCY_SLOTS) * self._shift(views)
        if self.output_factor_ != 1.0:  # the calibrated p90 (the features above keep the fitted one)
            output[:, 1] = np.maximum(np.minimum(pred[:, 0, 1] * self.output_factor_, cap), output[:, 0])
        remaining = np.where(np.isnan(pred[:, 1, 0]), output[:, 0], pred[:, 1, 0])
        priors_q = X_lat[:, QUALITY_COLUMN]  # the profiles' quality, as latency_matrix copied it
        quality = self.quality_.predict_proba(valid, quality_extras(features), features.agent, models, priors_q,
                                              in_range=self.quality_.n_terms >= N_TERMS)  # fmt: skip
        return _assemble(prior, output, remaining, quality, learned)

    def _shift(self, views: Sequence[BackendView]) -> Array:
        """The calibration factors of each candidate's load bucket, ``(n, 3, 2)`` (one ``(3, 2)`` for all
        when the calibration is pooled)."""
        edges, shift = self.load_edges_, self.latency_shift_
        if not edges:
            pooled: Array = shift[0]
            return pooled
        # load_bucket of worker_load, inline: plain Python over the few candidates (~3 us; numpy ~8 us)
        buckets = [bisect_left(edges, max((v.running or 0) + (v.waiting or 0), v.inflight_requests)) for v in views]
        by_load: Array = shift.take(buckets, axis=0)
        return by_load

    def _candidates(self, models: tuple[str, ...]) -> tuple[Array, npt.NDArray[np.intp]]:
        """(the codes of the distinct models among the candidates', each candidate's row among them): the
        same for every decision over the same candidates, so cached (a refit makes a new estimator)."""
        cache: dict[tuple[str, ...], tuple[Array, npt.NDArray[np.intp]]]
        cache = self.__dict__.setdefault("_candidates_cache", {})
        hit = cache.get(models)
        if hit is None:
            distinct = list(dict.fromkeys(models))
            codes = np.asarray([_code(self.models_, m) for m in distinct])
            hit = cache[models] = (codes, np.asarray([distinct.index(m) for m in models], dtype=np.intp))
            if len(cache) > 1024:  # candidate lists are few; bound it anyway
                cache.clear()
        return hit

    def calibration_factors(self) -> dict[str, float]:
        """The pooled conformal factors of the upper quantiles (1.0: not calibrated), by target."""
        require_fitted(self, "latency_pooled_")
        return {"output_tokens": float(self.output_factor_),
                **{t: float(f) for t, f in zip(LATENCY_TARGETS, self.latency_pooled_, strict=True)}}  # fmt: skip

    def load_calibration(self) -> dict[str, list[float]]:
        """The latency p90s' factors per load bucket (Mondrian): ``load_edges`` (bucket ``i`` holds loads
        in ``(edges[i-1], edges[i]]``), then one factor per bucket and target."""
        require_fitted(self, "latency_shift_")
        factors = {t: [float(f) for f in self.latency_shift_[:, j, 1]] for j, t in enumerate(LATENCY_TARGETS)}
        return {"load_edges": list(self.load_edges_), **factors}


def quality_extras(f: RequestFeatures) -> Array:
    """The quality model's dense inputs beside the task terms: the prompt's size (longer tasks are
    harder) and the workflow stage (a later round of a workflow)."""
    stage = -0.25 if f.workflow_stage is None else min(f.workflow_stage, 8) / 4.0
    return np.asarray([math.log1p(f.prompt_tokens) / 8.0, stage])


def _caps(max_tokens: Sequence[int | None]) -> Array:
    return np.asarray([c if c else np.inf for c in max_tokens], dtype=np.float64)


def _nan(v: float | None) -> float:
    return math.nan if v is None else float(v)
