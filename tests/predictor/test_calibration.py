"""Split-conformal calibration of the p90s: the split, the factor, and the fitted predictor."""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from predictor.calibration import MIN_ROWS, conformal_factor, group_split
from predictor.dataset import samples
from predictor.evaluate import evaluate
from predictor.latency import LatencyModel
from predictor.length import OutputLengthModel
from predictor.model import Predictor
from tests.predictor.synth import records

SMALL = {"max_iter": 15, "min_samples": 20}


def test_group_split_holds_out_whole_workflows() -> None:
    groups = [f"wf{i // 3}" for i in range(300)] + [None] * 30  # 100 workflows of 3, 30 lone requests
    held = group_split(groups, 0.25, seed=0)
    by_group: dict[str, set[bool]] = {}
    for g, h in zip(groups, held, strict=True):
        if g is not None:
            by_group.setdefault(g, set()).add(bool(h))
    assert all(len(v) == 1 for v in by_group.values())  # a workflow is held out whole or not at all
    assert 0.25 * len(groups) <= held.sum() < 0.25 * len(groups) + 3
    assert (group_split(groups, 0.25, seed=0) == held).all()
    assert (group_split(groups, 0.25, seed=1) != held).any()


def test_conformal_factor_covers_fresh_draws_at_the_level() -> None:
    rng = np.random.default_rng(0)
    predicted = np.ones(500)  # a "p90" that is really the median of lognormal(0, 0.5) answers
    factor = conformal_factor(rng.lognormal(0.0, 0.5, 500), predicted, 0.9)
    assert factor > 1.5
    fresh = rng.lognormal(0.0, 0.5, 20_000)
    assert 0.88 <= float(np.mean(fresh <= factor)) <= 0.93
    assert conformal_factor(rng.lognormal(0.0, 0.5, MIN_ROWS - 1), np.ones(MIN_ROWS - 1), 0.9) == 1.0
    # Over-wide forecasts are narrowed too.
    assert conformal_factor(rng.lognormal(0.0, 0.5, 500), np.full(500, 10.0), 0.9) < 0.5


def test_fit_calibrates_the_p90s_and_leaves_the_medians() -> None:
    train, test = samples(records(600, seed=1)), samples(records(300, seed=2))
    with threadpool_limits(limits=1, user_api="openmp"):
        plain = Predictor(length=OutputLengthModel(**SMALL), latency=LatencyModel(**SMALL), calibration=0.0).fit(train)
        cal = Predictor(length=OutputLengthModel(**SMALL), latency=LatencyModel(**SMALL)).fit(train)
    assert set(plain.calibration_factors().values()) == {1.0}
    factors = cal.calibration_factors()
    assert set(factors) == {"output_tokens", "ttft", "tpot", "e2e"} and factors["e2e"] != 1.0
    s = test[0]
    a = plain.predict(s.features, (s.view,), (s.profile,), full=True)
    b = cal.predict(s.features, (s.view,), (s.profile,), full=True)
    # The final model is fitted on all the data either way: same medians, p90s scaled by the factor.
    np.testing.assert_array_equal(a.e2e[:, 0], b.e2e[:, 0])
    np.testing.assert_allclose(b.e2e[:, 1], np.maximum(a.e2e[:, 1] * factors["e2e"], b.e2e[:, 0]), rtol=1e-12)
    report = evaluate(cal, test)
    for target in ("ttft_ms", "e2e_ms", "output_tokens"):
        assert 0.85 <= report[target]["p90_coverage"] <= 0.95, (target, report[target])


def test_a_target_left_to_the_prior_is_not_calibrated() -> None:
    train, s = samples(records(300, seed=1)), samples(records(1, seed=2))[0]
    with threadpool_limits(limits=1, user_api="openmp"):
        p = Predictor(length=OutputLengthModel(min_samples=10_000), latency=LatencyModel(**SMALL)).fit(train)
    assert not p.length_.learned(0) and p.calibration_factors()["output_tokens"] == 1.0
    assert p.calibration_factors()["e2e"] != 1.0
    pred = p.predict(s.features, (s.view,), (s.profile,), full=True)
    assert np.isfinite(pred.output).all() and np.isfinite(pred.e2e).all()
