"""Latency: p50/p90 of TTFT, TPOT and e2e per candidate worker.

One row per candidate: the request (prompt estimate, ``max_tokens``, messages, stream, its expected
cached share on that worker and the uncached rest, its predicted output p50/p90), the worker's live
state (running, waiting, KV use, this gateway's in-flight requests and tokens, TTFT/TPOT EWMAs, the
scrape's age) and its model's profile (step-time coefficients, quality, and the analytic prior's
TTFT/TPOT/e2e for this request — so the trees learn corrections to physics rather than physics).
Missing values are ``-1`` (trees split them off; the packed evaluator needs finite inputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from predictor.boosting import Array, MultiQuantileRegressor
from predictor.prior import WorkerProfile
from router.core.types import BackendView, RequestFeatures

TARGETS = ("ttft", "tpot", "e2e")
N_COLUMNS = 24
QUALITY_COLUMN = 18  # the profile's quality (the last of _profile_columns)


class LatencyModel(MultiQuantileRegressor):
    """:class:`MultiQuantileRegressor` over :func:`latency_matrix` features and :data:`TARGETS`."""


def _opt(v: float | None) -> float:
    return -1.0 if v is None else float(v)


def latency_matrix(
    f: RequestFeatures,
    views: Sequence[BackendView],
    profiles: Sequence[WorkerProfile],
    cached: Array,
    output: Array,
    prior: Array,
) -> Array:
    """``cached``: (n,) shares; ``output``: (n, 2) predicted p50/p90 tokens; ``prior``: (n, 2) TTFT/TPOT s.

    Built column-wise (one small array per source, no per-worker Python rows): this is on the
    decision path."""
    n = len(views)
    prompt = float(f.prompt_tokens)
    cached = np.asarray(cached, dtype=np.float64)
    # Inline, not _opt: 64 calls a decision.
    live = np.asarray(
        [(-1.0 if v.running is None else float(v.running), -1.0 if v.waiting is None else float(v.waiting),
          -1.0 if v.kv_usage is None else float(v.kv_usage), float(v.inflight_requests), float(v.inflight_tokens),
          -1.0 if v.ttft_ewma_s is None else float(v.ttft_ewma_s),
          -1.0 if v.tpot_ewma_s is None else float(v.tpot_ewma_s),
          -1.0 if v.metrics_age_s is None else min(float(v.metrics_age_s), 60.0)) for v in views],
        dtype=np.float64,
    ).reshape(n, 8)  # fmt: skip
    ttft, tpot = prior[:, 0], prior[:, 1]
    out50 = output[:, 0]
    X = np.empty((n, N_COLUMNS), dtype=np.float64)
    X[:, 0:4] = (prompt, _opt(f.max_tokens), float(f.message_count), 1.0 if f.stream else 0.0)
    X[:, 4] = cached
    X[:, 5] = prompt * (1.0 - cached)
    X[:, 6:14] = live
    X[:, 14:19] = _profile_columns(tuple(profiles))
    X[:, 19] = np.log(ttft)
    X[:, 20] = np.log(tpot)
    X[:, 21] = np.log(ttft + np.maximum(out50 - 1.0, 0.0) * tpot)
    X[:, 22:24] = output[:, :2]
    return X


@lru_cache(maxsize=256)
def _profile_columns(profiles: tuple[WorkerProfile, ...]) -> Array:
    return np.asarray([[p.base * 1e3, p.prefill * 1e6, p.decode_seqs * 1e6, p.decode_ctx * 1e9, p.quality]
                       for p in profiles], dtype=np.float64).reshape(len(profiles), 5)  # fmt: skip
