"""Accuracy of a predictor on logged traffic: the same prediction path the policy uses, on the worker
that actually served each request, against what happened.

Latency targets are scored as quantile forecasts (llm-d's advice): p90 coverage (share of requests
at or under their predicted p90; 0.9 is perfect calibration), pinball loss of p50 and p90 (ms), and
for the p50 the mean absolute percentage error. Output length: Kendall's tau between predicted p50
and actual tokens (does it rank requests right — what shortest-job-first needs), p90 coverage,
MAPE. Quality: Brier score against feedback, where there is any.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from predictor.boosting import Array
from predictor.model import Estimator, Predictor, Sample
from predictor.prior import changed_profiles


def pinball(actual: Array, predicted: Array, q: float) -> float:
    d = actual - predicted
    return float(np.mean(np.maximum(q * d, (q - 1.0) * d)))


def _quantile_scores(actual: Array, p50: Array, p90: Array, scale: float) -> dict[str, float]:
    ok = np.isfinite(actual) & (actual > 0)
    a, m, h = actual[ok] * scale, p50[ok] * scale, p90[ok] * scale
    if len(a) == 0:
        return {"n": 0}
    return {
        "n": len(a),
        "p90_coverage": round(float(np.mean(a <= h)), 4),
        "p50_coverage": round(float(np.mean(a <= m)), 4),
        "pinball_p50": round(pinball(a, m, 0.5), 3),
        "pinball_p90": round(pinball(a, h, 0.9), 3),
        "p50_mape": round(float(np.mean(np.abs(m - a) / a)), 4),
        "p50_median_ape": round(float(np.median(np.abs(m - a) / a)), 4),
        "actual_p50": round(float(np.median(a)), 3),
    }


def evaluate(estimator: Estimator, data: Sequence[Sample]) -> dict[str, Any]:
    """Scores of ``estimator`` on ``data`` (latencies in ms, lengths in tokens)."""
    n = len(data)
    pred = np.full((n, 4, 2), np.nan)  # ttft, tpot, e2e, output x p50, p90
    quality = np.full(n, np.nan)
    for i, s in enumerate(data):
        p = (estimator.predict(s.features, (s.view,), (s.profile,), full=True) if isinstance(estimator, Predictor)
             else estimator.predict(s.features, (s.view,), (s.profile,)))  # fmt: skip
        pred[i] = np.stack([p.ttft[0], p.tpot[0], p.e2e[0], p.output[0]])
        quality[i] = p.quality[0]
    actual = np.asarray([[_f(s.ttft_s), _f(s.tpot_s), _f(s.e2e_s), _f(s.output_tokens)] for s in data]).reshape(n, 4)
    out: dict[str, Any] = {"samples": n}
    for j, (name, scale) in enumerate((("ttft_ms", 1e3), ("tpot_ms", 1e3), ("e2e_ms", 1e3), ("output_tokens", 1.0))):
        out[name] = _quantile_scores(actual[:, j], pred[:, j, 0], pred[:, j, 1], scale)
    # Diagnostic: e2e had the answer's length been known (TTFT p50 + (tokens - 1) x TPOT p50) - what is
    # left of the e2e error once the output length's own uncertainty is taken out.
    given = pred[:, 0, 0] + np.maximum(actual[:, 3] - 1.0, 0.0) * pred[:, 1, 0]
    known = _quantile_scores(actual[:, 2], given, given, 1e3)  # a p50 only: its p90 fields would be the p50's
    out["e2e_given_length_ms"] = {k: v for k, v in known.items() if not k.endswith("p90") and k != "p90_coverage"}
    ok = np.isfinite(actual[:, 3])
    if ok.sum() > 2:
        tau = kendalltau(pred[ok, 3, 0], actual[ok, 3]).statistic
        out["output_tokens"]["kendall_tau"] = round(float(tau), 4) if math.isfinite(tau) else None
    rated = np.asarray([s.score is not None for s in data], dtype=bool)
    if rated.any():
        scores = np.asarray([s.score for s in data if s.score is not None], dtype=np.float64)
        brier = float(np.mean((quality[rated] - (scores >= 0.5)) ** 2))
        out["quality"] = {"n": int(rated.sum()), "brier": round(brier, 4),
                          "base_rate": round(float(np.mean(scores >= 0.5)), 4)}  # fmt: skip
    changed = changed_profiles(getattr(estimator, "profiles_", {}), {s.profile.name: s.profile for s in data})
    if changed:  # the logs ran on profiles the model knew by other terms: its latency inputs differ from training's
        out["profiles_changed"] = changed
    return out


def _f(v: float | None) -> float:
    return math.nan if v is None else float(v)
