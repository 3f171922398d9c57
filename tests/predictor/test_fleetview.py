"""/fleet's predicted latency: a reference request per worker, in the worker's current state."""

from __future__ import annotations

import pytest

from predictor.fleetview import REFERENCE_OUTPUT_TOKENS, prior_predictions, slot_predictions
from predictor.model import ModelSlot, PriorPredictor
from predictor.prior import profile_for
from router.core.types import BackendView

PROFILES = {"idle": profile_for("h200-qwen2.5-7b"), "busy": profile_for("h200-qwen2.5-7b"),
            "small": profile_for("h200-qwen2.5-0.5b")}  # fmt: skip
VIEWS = (
    BackendView(name="idle", model="qwen2.5-7b"),
    BackendView(
        name="busy",
        model="qwen2.5-7b",
        running=40,
        waiting=12,
        kv_usage=0.95,
        inflight_requests=52,
        inflight_tokens=52 * 1500,
    ),
    BackendView(name="small", model="qwen2.5-0.5b"),
)


def test_prior_predictions_follow_load_and_model_size() -> None:
    p = prior_predictions(VIEWS, PROFILES)
    assert set(p) == {"idle", "busy", "small"}
    assert p["busy"]["ttft_ms"] > 1.2 * p["idle"]["ttft_ms"] and p["busy"]["tpot_ms"] > p["idle"]["tpot_ms"]
    assert p["small"]["tpot_ms"] < p["idle"]["tpot_ms"]  # a 0.5B decodes faster than a 7B
    for row in p.values():
        assert row["e2e_ms"] == pytest.approx(row["ttft_ms"] + (REFERENCE_OUTPUT_TOKENS - 1) * row["tpot_ms"], rel=1e-3)


def test_the_gateways_estimator_agrees_with_the_prior_before_training() -> None:
    assert slot_predictions(ModelSlot(PriorPredictor()), VIEWS, PROFILES) == prior_predictions(VIEWS, PROFILES)
    assert slot_predictions(ModelSlot(PriorPredictor()), (), PROFILES) == {}
