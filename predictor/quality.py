"""Quality: each model's probability of a good answer to this prompt.

Prior: the profile's ``quality``. Learned from feedback (``POST /v1/feedback``): a logistic
regression per model on the prompt's hashed sketch, shrunk toward the prior by ``prior_strength``
pseudo-samples — ``(n · p_model + k · prior) / (n + k)`` — so a model with little feedback keeps
its prior and one with much feedback follows the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.linear_model import LogisticRegression

from predictor.boosting import Array, require_fitted


class QualityModel(BaseEstimator):  # type: ignore[misc]
    def __init__(self, C: float = 1.0, prior_strength: float = 30.0, min_samples: int = 20) -> None:
        self.C = C
        self.prior_strength = prior_strength
        self.min_samples = min_samples

    def fit(self, X: Any, y: Any, models: Sequence[str] = ()) -> Self:
        """``X``: (n, sketch) features; ``y``: 1 for a good answer, 0 for a bad one; ``models``: who answered."""
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64) >= 0.5
        names = np.asarray(models)
        if len(names) != len(X) or len(y) != len(X):
            raise ValueError("X, y and models must have the same length")
        kept: list[str] = []
        coef: list[Array] = []
        intercept: list[float] = []
        counts: list[int] = []
        for m in sorted(set(names.tolist())):
            rows = names == m
            n = int(rows.sum())
            if n < self.min_samples:
                continue
            ym = y[rows]
            if ym.all() or not ym.any():  # one class: a constant rate, smoothed away from 0 and 1
                rate = (ym.sum() + 0.5) / (n + 1.0)
                coef.append(np.zeros(X.shape[1]))
                intercept.append(float(np.log(rate / (1.0 - rate))))
            else:
                lr = LogisticRegression(C=self.C, max_iter=200).fit(X[rows], ym)
                coef.append(lr.coef_[0].astype(np.float64))
                intercept.append(float(lr.intercept_[0]))
            kept.append(m)
            counts.append(n)
        self.n_features_in_ = X.shape[1]
        self.models_ = tuple(kept)
        self.coef_ = np.asarray(coef).reshape(len(kept), X.shape[1])
        self.intercept_ = np.asarray(intercept)
        self.counts_ = np.asarray(counts, dtype=np.float64)
        return self

    def predict_proba(self, sketch: Array, models: Sequence[str], priors: Array) -> Array:
        """P(good) of each of ``models`` answering the prompt whose sketch is ``sketch`` (1-D)."""
        require_fitted(self, "models_")
        out = np.asarray(priors, dtype=np.float64).copy()
        if not self.models_ or len(sketch) != self.n_features_in_:
            return out
        z = self.coef_ @ sketch + self.intercept_
        p = 1.0 / (1.0 + np.exp(-z))
        k = self.prior_strength
        for i, m in enumerate(models):
            if m in self.models_:
                j = self.models_.index(m)
                n = self.counts_[j]
                out[i] = (n * p[j] + k * out[i]) / (n + k)
        return out
