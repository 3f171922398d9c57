"""Several fitted ``HistGradientBoostingRegressor`` s evaluated together in a few numpy operations.

scikit-learn's ``predict`` costs ~0.3-1 ms per model even for 8 rows (input validation, then one
Cython call per tree). A routing decision needs six quantile models over ~8 candidate workers in
well under a millisecond, so :class:`PackedForest` copies the trees' nodes into flat arrays once
(after ``fit``) and walks every tree of every model for every row at once, one tree level per step.
The result equals ``model.predict(X)`` (tested) for finite inputs — callers replace missing values
by a sentinel before both fitting and predicting.

The layout keeps a level step to six small numpy operations (it runs ``depth`` times per call, on
rows x trees node ids): nodes are renumbered so that a node's right child follows its left one
(the next node is ``left[node] + went_right``); a leaf is its own left child with an infinite
threshold (it stays put); and the node arrays are repeated once per row, with the row's offset
folded into the node ids and into the feature index, so a step gathers straight from the flattened
``X`` without adding a row offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
_Tiled = tuple[Ints, Array, Ints, Array, Ints]
BLOCK = 32  # rows per walk (a decision has one per candidate worker); more rows go block by block


def _tree_arrays(nodes: Any, offset: int) -> tuple[Ints, Array, Ints, Array]:
    """(feature, threshold, left child, value) of one tree's nodes, breadth first with siblings
    adjacent, node ids starting at ``offset``; leaves point to themselves and never go right."""
    order, new_id = [0], {0: 0}
    left = [0]
    for old in order:  # grows while walking: breadth first
        if nodes["is_leaf"][old]:
            left[new_id[old]] = new_id[old]
            continue
        left[new_id[old]] = len(order)
        for child in (int(nodes["left"][old]), int(nodes["right"][old])):
            new_id[child] = len(order)
            order.append(child)
            left.append(0)
    old_ids = np.asarray(order, dtype=np.int64)
    leaf = nodes["is_leaf"][old_ids].astype(bool)
    feature = np.where(leaf, 0, nodes["feature_idx"][old_ids]).astype(np.int64)
    threshold = np.where(leaf, np.inf, nodes["num_threshold"][old_ids]).astype(np.float64)
    value = np.where(leaf, nodes["value"][old_ids], 0.0).astype(np.float64)
    return feature, threshold, np.asarray(left, dtype=np.int64) + offset, value


class PackedForest:
    """The trees of ``models`` (fitted regressors over the same features), packed for batch evaluation."""

    def __init__(self, models: Sequence[Any]) -> None:
        feats: list[Ints] = []
        thresholds: list[Array] = []
        lefts: list[Ints] = []
        values: list[Array] = []
        roots: list[int] = []
        starts: list[int] = []
        baselines: list[float] = []
        depth, offset = 0, 0
        for m in models:
            starts.append(len(roots))
            baselines.append(float(np.ravel(m._baseline_prediction)[0]))
            for (tree,) in m._predictors:
                nodes = tree.nodes
                if nodes["is_categorical"].any():
                    raise ValueError("PackedForest does not support categorical splits")
                feature, threshold, left, value = _tree_arrays(nodes, offset)
                feats.append(feature)
                thresholds.append(threshold)
                lefts.append(left)
                values.append(value)
                roots.append(offset)
                depth = max(depth, int(nodes["depth"].max()))
                offset += len(feature)
        if not roots:
            raise ValueError("PackedForest needs at least one fitted model")
        self.n_models = len(starts)
        self.n_features = int(models[0].n_features_in_)
        self.depth = depth
        self.feature = np.concatenate(feats)
        self.threshold = np.concatenate(thresholds)
        self.left = np.concatenate(lefts)
        self.value = np.concatenate(values)
        self.roots = np.asarray(roots, dtype=np.int64)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.baseline = np.asarray(baselines)
        self.root_feature = self.feature[self.roots]
        self.root_threshold = self.threshold[self.roots]
        self._tiled = self._tile()

    def _tile(self) -> _Tiled:
        """The node arrays repeated for :data:`BLOCK` rows: row ``r``'s node ids and feature indices offset
        by ``r x nodes`` and ``r x features``."""
        n = len(self.feature)
        r = np.arange(BLOCK, dtype=np.int64)[:, None]
        return ((self.feature + r * self.n_features).ravel(), np.tile(self.threshold, BLOCK),
                (self.left + r * n).ravel(), np.tile(self.value, BLOCK), self.left[self.roots] + r * n)  # fmt: skip

    def __getstate__(self) -> dict[str, Any]:  # the repeated arrays are rebuilt on load
        return {k: v for k, v in self.__dict__.items() if k != "_tiled"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._tiled = self._tile()

    def predict(self, X: Array) -> Array:
        """Raw predictions, shape ``(len(X), n_models)``."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X has shape {X.shape}; the forest reads {self.n_features} features")
        if len(X) <= BLOCK:
            return self._predict_block(X)
        return np.concatenate([self._predict_block(X[i : i + BLOCK]) for i in range(0, len(X), BLOCK)])

    def _predict_block(self, X: Array) -> Array:
        feature, threshold, left, value, root_left = self._tiled
        flat = X.ravel()
        # The first level reads the roots' splits directly (no gather of node ids).
        idx = root_left[: len(X)] + (X[:, self.root_feature] > self.root_threshold)
        for _ in range(self.depth - 1):
            idx = left[idx] + (flat[feature[idx]] > threshold[idx])
        out: Array = np.add.reduceat(value[idx], self.starts, axis=1) + self.baseline
        return out
