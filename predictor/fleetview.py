"""Predicted latency per worker for ``GET /fleet``: a reference request, as the gateway would predict it now.

The reference is a chat request of :data:`REFERENCE_PROMPT_TOKENS` prompt tokens (none cached) and
:data:`REFERENCE_OUTPUT_TOKENS` output tokens, sent to each worker in its current state (running,
waiting, KV use, in-flight requests and tokens). A gateway with a predictor (the ``predictive``
policy, or ``gateway.predictor``) takes TTFT from its current estimator — learned or the prior — as
a decision does, and TPOT from the prior (as a decision does too), both corrected by each worker's
observed / predicted ratios (``ttft_bias``, ``tpot_bias``) as a decision corrects them; e2e is TTFT + 255 x TPOT, the
reference's own length, not a predicted one. Any other gateway uses the analytic prior of the
workers' profiles
(:func:`predictor.prior.prior_latency`: numpy and the profiles only, no scikit-learn import).
Times are p50s in wall-clock milliseconds, what a client of the worker would measure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from predictor.prior import WorkerProfile, prior_latency, profiles_by_model
from router.core.types import BackendView, RequestFeatures

if TYPE_CHECKING:
    from predictor.model import ModelSlot

REFERENCE_PROMPT_TOKENS = 1024
REFERENCE_OUTPUT_TOKENS = 256


def reference() -> dict[str, Any]:
    """What the predictions are for (shown beside them)."""
    return {"prompt_tokens": REFERENCE_PROMPT_TOKENS, "output_tokens": REFERENCE_OUTPUT_TOKENS}


def _row(ttft_s: float, tpot_s: float, out: float) -> dict[str, float]:
    return {
        "ttft_ms": round(ttft_s * 1e3, 3),
        "tpot_ms": round(tpot_s * 1e3, 3),
        "e2e_ms": round((ttft_s + max(out - 1.0, 0.0) * tpot_s) * 1e3, 3),
    }


def prior_predictions(
    views: Sequence[BackendView], profiles: Mapping[str, WorkerProfile]
) -> dict[str, dict[str, float]]:
    """Worker name -> the analytic prior's p50s for the reference request."""
    wps = profiles_by_model(profiles, tuple(views))
    out = float(REFERENCE_OUTPUT_TOKENS)
    return {
        v.name: _row(*prior_latency(wp, v, REFERENCE_PROMPT_TOKENS, 0.0), out) for v, wp in zip(views, wps, strict=True)
    }


def slot_predictions(
    slot: ModelSlot, views: Sequence[BackendView], profiles: Mapping[str, WorkerProfile]
) -> dict[str, dict[str, float]]:
    """Worker name -> the gateway's current estimator's p50s for the reference request (its output
    length fixed at the reference's, so workers compare on latency alone)."""
    if not views:
        return {}
    features = RequestFeatures(
        agent="",
        endpoint="chat",
        models=tuple(dict.fromkeys(v.model for v in views)),
        prompt_tokens=REFERENCE_PROMPT_TOKENS,
        max_tokens=REFERENCE_OUTPUT_TOKENS,
        stream=True,
    )
    p = slot.current.predict(features, tuple(views), profiles_by_model(profiles, tuple(views)))
    out = float(REFERENCE_OUTPUT_TOKENS)
    return {
        v.name: _row(float(p.ttft[i, 0]) * v.ttft_bias, float(p.tpot[i, 0]) * v.tpot_bias, out)
        for i, v in enumerate(views)
    }
