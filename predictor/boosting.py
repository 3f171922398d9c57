"""Quantile gradient boosting over several targets, the shared core of the length and latency models.

:class:`MultiQuantileRegressor` fits one ``HistGradientBoostingRegressor(loss="quantile")`` per
(target, quantile) on the log of the target (quantiles commute with a monotone transform, and
relative errors then weigh the same for a 20 ms and a 2 s answer), skipping rows where that target
is missing (NaN) and targets with too few rows. Prediction goes through a :class:`PackedForest`:
every model, every candidate, one batched call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.exceptions import NotFittedError

from predictor.forest import PackedForest

Array = npt.NDArray[np.float64]
Slots = tuple[tuple[int, int], ...]  # (target, quantile index) pairs
_SubForest = tuple[PackedForest | None, npt.NDArray[np.int64], npt.NDArray[np.int64]]


class MultiQuantileRegressor(BaseEstimator):  # type: ignore[misc]
    def __init__(
        self,
        quantiles: Sequence[float] = (0.5, 0.9),
        max_iter: int = 20,
        max_depth: int = 4,
        learning_rate: float = 0.3,
        min_samples_leaf: int = 20,
        min_samples: int = 50,
        random_state: int = 0,
    ) -> None:
        self.quantiles = quantiles
        self.max_iter = max_iter
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.min_samples_leaf = min_samples_leaf
        self.min_samples = min_samples
        self.random_state = random_state

    def fit(self, X: Any, Y: Any) -> Self:
        """``X``: (n, features); ``Y``: (n, targets) of positive values, NaN where unknown."""
        X = np.asarray(X, dtype=np.float64)
        Y = np.asarray(Y, dtype=np.float64)
        if Y.ndim == 1:
            Y = Y[:, None]
        if X.ndim != 2 or len(X) != len(Y):
            raise ValueError(f"X {X.shape} and Y {Y.shape} do not match")
        estimators: list[HistGradientBoostingRegressor] = []
        slots: list[tuple[int, int]] = []
        for t in range(Y.shape[1]):
            ok = np.isfinite(Y[:, t]) & (Y[:, t] > 0)
            if ok.sum() < self.min_samples:
                continue
            for qi, q in enumerate(self.quantiles):
                est = HistGradientBoostingRegressor(
                    loss="quantile", quantile=q, max_iter=self.max_iter, max_depth=self.max_depth,
                    learning_rate=self.learning_rate, min_samples_leaf=self.min_samples_leaf,
                    early_stopping=False, random_state=self.random_state,
                )  # fmt: skip
                estimators.append(est.fit(X[ok], np.log(Y[ok, t])))
                slots.append((t, qi))
        self.__dict__.pop("_subforests", None)  # a refit drops the sub-forests packed from the old trees
        self.n_features_in_ = X.shape[1]
        self.n_targets_ = Y.shape[1]
        self.estimators_ = estimators
        self.slots_ = slots
        self.forest_ = PackedForest(estimators) if estimators else None
        return self

    def predict(self, X: Array, slots: Slots | None = None) -> Array:
        """Shape ``(len(X), targets, quantiles)``; NaN for a target that was not learned.

        ``slots``: only these ``(target, quantile index)`` pairs (the rest NaN) — a decision that does
        not need a model keeps it out of the hot path (its packed forest is built once, then cached).
        """
        require_fitted(self, "slots_")
        out = np.full((len(X), self.n_targets_, len(self.quantiles)), np.nan)
        forest, targets, quantiles = self._forest_for(slots)
        if forest is not None:
            out[:, targets, quantiles] = np.exp(forest.predict(X))  # one scatter of every kept slot
        return out

    def _forest_for(self, slots: Slots | None) -> _SubForest:
        """The packed forest of ``slots`` (all: ``None``) and the (target, quantile) index arrays of its
        models; built once per ``slots``, then cached."""
        cache: dict[Slots | None, _SubForest] = self.__dict__.setdefault("_subforests", {})
        hit = cache.get(slots)
        if hit is None:
            idx = [j for j, s in enumerate(self.slots_) if slots is None or s in slots]
            kept = [self.slots_[j] for j in idx]
            forest = self.forest_ if slots is None or not idx else PackedForest([self.estimators_[j] for j in idx])
            forest = forest if idx else None  # no model of these slots was learned: nothing to walk
            targets = np.asarray([t for t, _ in kept], dtype=np.int64)
            quantiles = np.asarray([q for _, q in kept], dtype=np.int64)
            hit = cache[slots] = (forest, targets, quantiles)
        return hit

    def learned(self, target: int) -> bool:
        require_fitted(self, "slots_")
        return any(t == target for t, _ in self.slots_)


def require_fitted(estimator: object, attribute: str) -> None:
    """``check_is_fitted`` for the decision path: one attribute lookup (sklearn's costs ~10 us a call)."""
    if not hasattr(estimator, attribute):
        raise NotFittedError(f"This {type(estimator).__name__} instance is not fitted yet. Call 'fit' first.")
