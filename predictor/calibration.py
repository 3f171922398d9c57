"""Split-conformal calibration of the predictor's upper quantiles.

Quantile trees fitted on a few thousand requests are over-confident out of sample: their p90s cover
~0.8 of new traffic, not 0.9 (the p90 of a tree ensemble fits the training rows' own noise, and the
latency model is trained on in-sample output-length predictions that are sharper than the ones it
sees later). Split-conformal calibration fixes the level without assumptions about the model:
:meth:`predictor.model.Predictor.fit` holds out a share of the training *workflows*, fits a copy on
the rest, and takes, for each upper quantile ``q``, the ``ceil((n + 1) q)``-th smallest log ratio
``log(actual / predicted)`` over the ``n`` held-out requests — the factor by which the predicted
quantile must be scaled to cover a share ``q`` of unseen requests (on exchangeable data, at least
``q``). The final model is then fitted on all the data and its upper quantiles scaled by these
factors (a model fitted on more data is, if anything, sharper, so the factor errs on the safe side).

The split is by workflow (``x-workflow-id``), not by request: the requests of one workflow share
its task, and a seed's workflow ``i`` is the same workflow in every run of that seed, so a random
split by request would calibrate on near-copies of the training rows. The median is left as
fitted: it is scored by its percentage error, which a shift to median-unbiasedness does not serve.

The latency p90s are calibrated per *load bucket* (Mondrian conformal prediction): one pooled factor
covers 0.9 of all requests on average, but not of the busy ones, whose latency spreads more (queueing,
a CPU-starved engine) — there the pooled factor under-covers and at idle it over-covers. The buckets
are the worker's load at dispatch (:func:`predictor.prior.worker_load`), cut at quantiles of the
*fitting* rows' load (:func:`load_edges`; not the calibration rows', so the edges do not depend on the
scores they bucket); each bucket gets the conformal factor of its own held-out requests, and a bucket
with fewer than :data:`MIN_ROWS` of them the pooled factor (:func:`mondrian_factors`). The output
length's p90 stays pooled: the answer's length does not depend on the worker's load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]

MIN_ROWS = 50  # fewer held-out requests with a target than this: that target is left uncalibrated


def group_split(groups: Sequence[str | None], fraction: float, seed: int) -> npt.NDArray[np.bool_]:
    """Mask of the calibration rows: whole groups, in a random order (``seed``), until at least
    ``fraction`` of the rows are in. A row without a group is a group of its own."""
    keys = [g if g is not None else f"\0{i}" for i, g in enumerate(groups)]
    names = sorted(set(keys))
    order = np.random.default_rng(seed).permutation(len(names))
    sizes: dict[str, int] = {}
    for k in keys:
        sizes[k] = sizes.get(k, 0) + 1
    chosen: set[str] = set()
    target, taken = fraction * len(keys), 0
    for i in order:
        if taken >= target:
            break
        chosen.add(names[i])
        taken += sizes[names[i]]
    return np.asarray([k in chosen for k in keys], dtype=bool)


def conformal_factor(actual: Array, predicted: Array, level: float) -> float:
    """The factor by which ``predicted`` (a quantile ``level`` forecast) must be scaled so that it
    covers ``actual`` at ``level`` by split conformal prediction; 1.0 with fewer than
    :data:`MIN_ROWS` usable pairs."""
    scores = _scores(actual, predicted)
    n = len(scores)
    if n < MIN_ROWS:
        return 1.0
    k = min(math.ceil((n + 1) * level), n)  # beyond n the conformal bound is infinite; take the largest
    return float(np.exp(scores[k - 1]))


def load_edges(load: Array, bins: int) -> Array:
    """Upper edges of ``bins`` load buckets at the quantiles of ``load`` (equal edges merged, so a load
    that most rows share — an idle fleet's 0 — does not make empty buckets); none for ``bins`` <= 1."""
    if bins <= 1 or not len(load):
        return np.empty(0)
    return np.unique(np.quantile(np.asarray(load, dtype=np.float64), np.arange(1, bins) / bins))


def load_bucket(edges: Array, load: Array) -> npt.NDArray[np.intp]:
    """Bucket of each ``load``: ``i`` holds ``edges[i - 1] < load <= edges[i]`` (a quantile edge closes
    its bucket, so an edge at 0 makes an "idle" bucket)."""
    return np.searchsorted(edges, load, side="left")


def mondrian_factors(actual: Array, predicted: Array, buckets: npt.NDArray[np.intp], n_buckets: int,
                     level: float) -> tuple[float, Array]:  # fmt: skip
    """(the pooled conformal factor, the factor of each of ``n_buckets`` buckets): a bucket's own
    split-conformal factor over its rows, the pooled one where it has fewer than :data:`MIN_ROWS`
    usable pairs (its own quantile would be noise)."""
    pooled = conformal_factor(actual, predicted, level)
    factors = np.full(n_buckets, pooled)
    for b in range(n_buckets):
        rows = buckets == b
        if len(_scores(actual[rows], predicted[rows])) >= MIN_ROWS:
            factors[b] = conformal_factor(actual[rows], predicted[rows], level)
    return pooled, factors


def _scores(actual: Array, predicted: Array) -> Array:
    """The sorted log ratios ``log(actual / predicted)`` of the usable (finite, positive) pairs."""
    ok = np.isfinite(actual) & (actual > 0) & np.isfinite(predicted) & (predicted > 0)
    return np.sort(np.log(actual[ok]) - np.log(predicted[ok]))
