"""Latency: p50/p90 of TTFT, TPOT and e2e per candidate worker.

One row per candidate: the request (prompt estimate, ``max_tokens``, messages, stream, its expected
cached share on that worker and the uncached rest, its predicted output p50/p90), the worker's live
state (running, waiting, KV use, this gateway's in-flight requests and tokens, TTFT/TPOT EWMAs, the
scrape's age) and its model's profile (step-time coefficients, quality, and the analytic prior's
TTFT/TPOT/e2e for this request — so the trees learn corrections to physics rather than physics).
Missing values are ``-1`` (trees split them off; the packed evaluator needs finite inputs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from predictor.boosting import Array, MultiQuantileRegressor
from predictor.prior import WorkerProfile
from router.types import BackendView, RequestFeatures

TARGETS = ("ttft", "tpot", "e2e")
N_COLUMNS = 25


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
    """``cached``: (n,) shares; ``output``: (n, 2) predicted p50/p90 tokens; ``prior``: (n, 2) TTFT/TPOT s."""
    prompt = float(f.prompt_tokens)
    head = [prompt, _opt(f.max_tokens), float(f.message_count), 1.0 if f.stream else 0.0]
    rows = []
    for i, v in enumerate(views):
        p = profiles[i]
        c = float(cached[i])
        out50, out90 = float(output[i, 0]), float(output[i, 1])
        ttft, tpot = float(prior[i, 0]), float(prior[i, 1])
        rows.append([
            *head, c, prompt * (1.0 - c),
            _opt(v.running), _opt(v.waiting), _opt(v.kv_usage), float(v.inflight_requests),
            float(v.inflight_tokens), _opt(v.ttft_ewma_s), _opt(v.tpot_ewma_s),
            min(_opt(v.metrics_age_s), 60.0),
            p.base * 1e3, p.prefill * 1e6, p.decode_seqs * 1e6, p.decode_ctx * 1e9, p.quality,
            math.log(ttft), math.log(tpot), math.log(ttft + max(out50 - 1.0, 0.0) * tpot), out50, out90,
        ])  # fmt: skip
    return np.asarray(rows, dtype=np.float64)
