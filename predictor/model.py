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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, clone
from sklearn.linear_model import Ridge
from sklearn.model_selection import cross_val_predict

from predictor.boosting import Array, require_fitted
from predictor.latency import LatencyModel, latency_matrix
from predictor.length import OutputLengthModel, length_matrix, length_row
from predictor.prior import (
    TPOT_P90_FACTOR,
    TTFT_P90_FACTOR,
    WorkerProfile,
    prior_latency,
    prior_output,
)
from predictor.quality import QualityModel, term_matrix
from predictor.sketch import N_TERMS
from router.types import BackendView, RequestFeatures


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


class Estimator(Protocol):
    def predict(
        self,
        features: RequestFeatures,
        views: Sequence[BackendView],
        profiles: Sequence[WorkerProfile],
        cached: Array | None = None,
    ) -> Prediction: ...


class ModelSlot:
    """The current estimator; replaced whole by a refit (one attribute store, atomic for readers)."""

    def __init__(self, current: Estimator) -> None:
        self.current = current
        self.version = 0

    def swap(self, estimator: Estimator) -> None:
        self.current = estimator
        self.version += 1


def cached_shares(features: RequestFeatures, views: Sequence[BackendView]) -> Array:
    hits = features.prefix_hits
    return np.asarray([hits.get(v.name, 0.0) for v in views], dtype=np.float64)


def _priors(f: RequestFeatures, views: Sequence[BackendView], profiles: Sequence[WorkerProfile],
            cached: Array) -> Array:  # fmt: skip
    return np.asarray([prior_latency(profiles[i], v, f.prompt_tokens, float(cached[i])) for i, v in enumerate(views)])


def _assemble(prior: Array, output: Array, remaining: Array, quality: Array, learned: Array | None) -> Prediction:
    """Fill what the learned models did not give (NaN) from the prior; keep p90 >= p50."""
    ttft = prior[:, 0:1] * _TTFT_FACTORS
    tpot = prior[:, 1:2] * _TPOT_FACTORS
    steps = np.maximum(output - 1.0, 0.0)
    if learned is None:
        e2e = ttft + steps * tpot
    else:
        ttft = np.where(np.isnan(learned[:, 0]), ttft, learned[:, 0])
        tpot = np.where(np.isnan(learned[:, 1]), tpot, learned[:, 1])
        e2e = np.where(np.isnan(learned[:, 2]), ttft + steps * tpot, learned[:, 2])
    for a in (ttft, tpot, e2e, output):
        a[:, 1] = np.maximum(a[:, 1], a[:, 0])
    return Prediction(ttft, tpot, e2e, output, remaining, quality)


_TTFT_FACTORS = np.asarray([1.0, TTFT_P90_FACTOR])
_TPOT_FACTORS = np.asarray([1.0, TPOT_P90_FACTOR])


class PriorPredictor:
    """Routing before any training: the analytic prior, the profile's quality."""

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
        quality = np.asarray([p.quality for p in profiles])
        return _assemble(_priors(features, views, profiles, cached), output, output[:, 0].copy(), quality, None)


# What a decision needs from the learned models (the rest stays out of the hot path): the answer's
# length p50/p90 and the workflow's remaining output p50; TTFT and e2e p50/p90. TPOT comes from the
# prior (it is only reported and checked against a TPOT SLO; the prior's TPOT is within ~1 % MAPE).
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
    """Learned output length, latency and quality (see the module docstring)."""

    def __init__(
        self,
        length: OutputLengthModel | None = None,
        latency: LatencyModel | None = None,
        quality: QualityModel | None = None,
    ) -> None:
        self.length = length
        self.latency = latency
        self.quality = quality

    def fit(self, X: Sequence[Sample], y: Any = None) -> Self:
        samples = list(X)
        if not samples:
            raise ValueError("no training samples")
        self.agents_ = tuple(sorted({s.features.agent for s in samples}))
        self.models_ = tuple(sorted({s.view.model for s in samples}))
        text_len = self._fit_text_length(samples)
        X_len = np.asarray([
            length_row(s.features, _code(self.agents_, s.features.agent), _code(self.models_, s.view.model), t)
            for s, t in zip(samples, text_len, strict=True)
        ])  # fmt: skip
        Y_len = np.asarray([[_nan(s.output_tokens), _nan(s.remaining_tokens)] for s in samples])
        self.length_ = clone(self.length if self.length is not None else OutputLengthModel()).fit(X_len, Y_len)
        output = self._output(self.length_.predict(X_len), [s.features.max_tokens for s in samples])
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
            term_matrix([s.features.terms for s in rated], np.asarray([_quality_extras(s.features) for s in rated]),
                        quality.n_terms),
            np.asarray([s.score for s in rated]),
            models=[s.view.model for s in rated],
            groups=[s.features.agent for s in rated],
        )  # fmt: skip
        self.n_samples_ = len(samples)
        return self

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

    def _text_length(self, f: RequestFeatures, t: npt.NDArray[np.int64]) -> float:
        """The ridge read-out for ``f`` whose term ids are ``t``; -1 without terms or a fit."""
        if not len(t) or not math.isfinite(getattr(self, "text_intercept_", math.nan)):
            return -1.0
        z = self.text_coef_[t[(t >= 0) & (t < N_TERMS)]].sum() + self.text_intercept_
        if f.agent in self.agents_:
            z += self.text_coef_[N_TERMS + self.agents_.index(f.agent)]
        return float(z)

    def _output(self, pred: Array, caps: Sequence[int | None]) -> Array:
        """This request's output p50/p90 from the length model's ``(n, targets, quantiles)``."""
        out = pred[:, 0, :].copy()
        cap = np.asarray([c if c else np.inf for c in caps], dtype=np.float64)
        for q, default in enumerate(prior_output(None)):
            out[:, q] = np.minimum(np.where(np.isnan(out[:, q]), default, out[:, q]), cap)
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
        models = [v.model for v in views]
        # Candidates of one model share a length prediction: predict once per distinct model.
        distinct = list(dict.fromkeys(models))
        codes = np.asarray([_code(self.models_, m) for m in distinct])
        terms = np.fromiter(features.terms, np.int64, len(features.terms))  # once, for length and quality
        X_len = length_matrix(features, _code(self.agents_, features.agent), codes, self._text_length(features, terms))
        pred = self.length_.predict(X_len, None if full else LENGTH_SLOTS)[[distinct.index(m) for m in models]]
        output = self._output(pred, [features.max_tokens] * len(views))
        remaining = np.where(np.isnan(pred[:, 1, 0]), output[:, 0], pred[:, 1, 0])
        prior = _priors(features, views, profiles, cached)
        X_lat = latency_matrix(features, views, profiles, cached, output, prior)
        learned = self.latency_.predict(X_lat, None if full else LATENCY_SLOTS)
        priors_q = np.asarray([p.quality for p in profiles])
        quality = self.quality_.predict_proba(terms, _quality_extras(features), features.agent, models, priors_q)
        return _assemble(prior, output, remaining, quality, learned)


def _quality_extras(f: RequestFeatures) -> Array:
    """The quality model's dense inputs beside the task terms: the prompt's size (longer tasks are
    harder) and the workflow stage (a later round of a workflow)."""
    stage = -0.25 if f.workflow_stage is None else min(f.workflow_stage, 8) / 4.0
    return np.asarray([math.log1p(f.prompt_tokens) / 8.0, stage])


def _nan(v: float | None) -> float:
    return math.nan if v is None else float(v)
