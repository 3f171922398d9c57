"""Split-conformal calibration of the p90s: the split, the factor, the load buckets (Mondrian), and the
fitted predictor."""

from __future__ import annotations

import dataclasses

import numpy as np
from threadpoolctl import threadpool_limits

from predictor.calibration import MIN_ROWS, conformal_factor, group_split, load_bucket, load_edges, mondrian_factors
from predictor.dataset import samples
from predictor.evaluate import evaluate
from predictor.latency import LatencyModel
from predictor.length import OutputLengthModel
from predictor.model import Predictor
from predictor.prior import worker_load
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
    assert set(plain.calibration_factors().values()) == {1.0} and plain.load_calibration()["load_edges"] == []
    factors, by_load = cal.calibration_factors(), cal.load_calibration()
    assert set(factors) == {"output_tokens", "ttft", "tpot", "e2e"} and factors["e2e"] != 1.0
    assert len(by_load["load_edges"]) == 2 and by_load["e2e"] == [factors["e2e"]] * 3  # e2e: pooled
    s = test[0]
    a = plain.predict(s.features, (s.view,), (s.profile,), full=True)
    b = cal.predict(s.features, (s.view,), (s.profile,), full=True)
    # The final model is fitted on all the data either way: same medians, p90s scaled by the factor (TTFT's
    # that of the worker's load bucket).
    np.testing.assert_array_equal(a.e2e[:, 0], b.e2e[:, 0])
    np.testing.assert_allclose(b.e2e[:, 1], np.maximum(a.e2e[:, 1] * factors["e2e"], b.e2e[:, 0]), rtol=1e-12)
    ttft = by_load["ttft"][int(load_bucket(np.asarray(by_load["load_edges"]), np.asarray([worker_load(s.view)]))[0])]
    np.testing.assert_allclose(b.ttft[:, 1], np.maximum(a.ttft[:, 1] * ttft, b.ttft[:, 0]), rtol=1e-12)
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


def test_load_edges_and_buckets() -> None:
    load = np.arange(30, dtype=np.float64)
    edges = load_edges(load, 3)
    np.testing.assert_allclose(edges, [9.666666666666666, 19.333333333333332])
    np.testing.assert_array_equal(load_bucket(edges, np.asarray([0, 9, 10, 19, 20, 99.0])), [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(load_bucket(np.asarray([0.0, 5.0]), np.asarray([0.0, 1.0, 5.0, 6.0])), [0, 1, 1, 2])
    assert len(load_edges(load, 1)) == 0 and len(load_edges(np.empty(0), 3)) == 0
    # Most rows idle: equal quantiles merge, no empty bucket between them; an edge at 0 is the idle bucket.
    np.testing.assert_array_equal(load_edges(np.asarray([0.0] * 60 + [5.0] * 20 + [9.0] * 20), 4), [0.0, 5.0])


def _busy_spread(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Loads 0..29 and answers whose log spread grows with the load (queueing): a p90 forecast of 1 that
    ignores the load is too narrow on a busy worker and too wide on an idle one."""
    load = rng.integers(0, 30, n).astype(np.float64)
    return load, rng.lognormal(0.0, 0.05 + 0.03 * load)


def test_mondrian_covers_every_load_bucket_where_the_pooled_factor_does_not() -> None:
    rng = np.random.default_rng(0)
    edges = load_edges(_busy_spread(rng, 1000)[0], 3)  # from other (fitting) rows than the calibration's
    load, actual = _busy_spread(rng, 900)
    pooled, factors = mondrian_factors(actual, np.ones(900), load_bucket(edges, load), 3, 0.9)
    assert pooled == conformal_factor(actual, np.ones(900), 0.9)
    assert factors[0] < pooled < factors[2]
    fresh_load, fresh = _busy_spread(rng, 60_000)
    bucket = load_bucket(edges, fresh_load)
    for b in range(3):
        rows = bucket == b
        pooled_cover, own_cover = float(np.mean(fresh[rows] <= pooled)), float(np.mean(fresh[rows] <= factors[b]))
        assert 0.86 <= own_cover <= 0.94, (b, own_cover)
        if b == 0:
            assert pooled_cover > 0.97  # pooled: the idle over-covered ...
        if b == 2:
            assert pooled_cover < 0.82  # ... and the busy under-covered
    assert 0.88 <= float(np.mean(fresh <= factors[bucket])) <= 0.92  # and overall still at the level


def test_a_sparse_load_bucket_falls_back_to_the_pooled_factor() -> None:
    rng = np.random.default_rng(1)
    load, actual = _busy_spread(rng, 400)
    buckets = load_bucket(np.asarray([14.0, 28.0]), load)  # bucket 2: load 29 only, ~13 rows
    assert 0 < (buckets == 2).sum() < MIN_ROWS
    pooled, factors = mondrian_factors(actual, np.ones(400), buckets, 4, 0.9)  # bucket 3: empty
    assert factors[2] == factors[3] == pooled and factors[0] < pooled < factors[1]


def _slowed_when_busy(n: int, seed: int) -> list[dict[str, object]]:
    """The synthetic log with a TTFT slowdown that no feature sees, spread wider the busier the worker
    (the shared VM's CPU contention, which hits queued requests most)."""
    rng = np.random.default_rng(seed + 100)
    out = records(n, seed)
    for r in out:
        fleet = r["fleet"]
        r["ttft_s"] = float(r["ttft_s"]) * rng.lognormal(0.0, 0.03 * fleet["inflight_requests"])  # type: ignore
        r["e2e_s"] = r["ttft_s"] + (int(r["completion_tokens"]) - 1) * float(r["tpot_s"])  # type: ignore
    return out


def test_the_fitted_predictor_calibrates_ttft_per_load_bucket() -> None:
    """A latency model too small to learn how the load widens TTFT's spread (3 trees): the pooled factor
    under-covers busy workers and over-covers idle ones; per load bucket, every bucket is covered."""
    train, test = samples(_slowed_when_busy(900, 1)), samples(_slowed_when_busy(3000, 2))
    lat = LatencyModel(max_iter=3, min_samples=20)
    with threadpool_limits(limits=1, user_api="openmp"):
        pooled = Predictor(length=OutputLengthModel(**SMALL), latency=lat, load_bins=1).fit(train)
        p = Predictor(length=OutputLengthModel(**SMALL), latency=lat).fit(train)
    by_load = p.load_calibration()
    edges = np.asarray(by_load["load_edges"])
    assert len(edges) == 2 and by_load["ttft"][0] < by_load["ttft"][1] < by_load["ttft"][2]
    assert by_load["tpot"] == [p.calibration_factors()["tpot"]] * 3  # only TTFT's per load, by default
    bucket = load_bucket(edges, np.asarray([worker_load(s.view) for s in test], dtype=np.float64))
    for b, (lo, hi) in enumerate(((0.95, 1.0), (0.85, 0.95), (0.0, 0.82))):
        rows = [s for s, k in zip(test, bucket, strict=True) if k == b]
        assert lo <= evaluate(pooled, rows)["ttft_ms"]["p90_coverage"] <= hi, b
        assert 0.85 <= evaluate(p, rows)["ttft_ms"]["p90_coverage"] <= 0.95, b
    busy = [s for s, k in zip(test, bucket, strict=True) if k == 2]
    s = busy[0]  # the same request on an idle and on a busy worker: each p90 scaled by its bucket's factor
    idle = dataclasses.replace(s.view, inflight_requests=0, running=0)
    with threadpool_limits(limits=1, user_api="openmp"):
        plain = Predictor(length=OutputLengthModel(**SMALL), latency=lat, calibration=0.0).fit(train)
    a = plain.predict(s.features, (idle, s.view), (s.profile, s.profile), full=True)
    b = p.predict(s.features, (idle, s.view), (s.profile, s.profile), full=True)
    np.testing.assert_allclose(b.ttft[:, 1], np.maximum(a.ttft[:, 1] * [by_load["ttft"][0], by_load["ttft"][2]],
                                                        b.ttft[:, 0]), rtol=1e-12)  # fmt: skip
