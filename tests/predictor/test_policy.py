"""The predictive policy's rule on hand-built snapshots (a stub predictor fixes the predictions)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from predictor.dataset import samples
from predictor.model import ModelSlot, Prediction, Predictor
from predictor.prior import WorkerProfile, profile_for
from router.core.config import PolicyOptions
from router.core.types import BackendView, FleetSnapshot, RequestFeatures
from router.policies import create_policy
from router.policies.predictive import guarded_shares, make_predictive
from tests.conftest import make_config
from tests.predictor.synth import records


class Fixed:
    """Predicts e2e p90 / TTFT p90 (ms) and quality per worker name."""

    def __init__(self, table: dict[str, tuple[float, float, float]]) -> None:
        self.table = table

    def predict(self, features: RequestFeatures, views: Sequence[BackendView], profiles: Sequence[WorkerProfile],
                cached: np.ndarray | None = None) -> Prediction:  # fmt: skip
        rows = np.asarray([self.table[v.name] for v in views]) / np.asarray([1e3, 1e3, 1.0])
        e2e = np.stack([rows[:, 0] * 0.8, rows[:, 0]], axis=1)
        ttft = np.stack([rows[:, 1] * 0.8, rows[:, 1]], axis=1)
        out = np.tile([100.0, 200.0], (len(views), 1))
        return Prediction(ttft, ttft / 10, e2e, out, out[:, 0], rows[:, 2])


VIEWS = tuple(BackendView(name=n, model="m") for n in ("fast", "good", "best", "slow"))
TABLE = {"fast": (1000, 100, 0.5), "good": (1250, 150, 0.8), "best": (1400, 120, 0.95), "slow": (5000, 900, 0.99)}


def decide(features: RequestFeatures, table: dict[str, tuple[float, float, float]] = TABLE, slack: float = 1.3,
           views: tuple[BackendView, ...] = VIEWS, wrong_s: float = 0.0, spread: float = 0.0,
           seq: int = 0) -> tuple[str, ...]:  # fmt: skip
    """The ranking for ``features`` (with ``seq``); ``spread``: the near-tie margin (0 here: the plain rule)."""
    options = PolicyOptions(latency_slack=slack, wrong_answer_s=wrong_s, spread_margin=spread)
    policy = make_predictive(options, ModelSlot(Fixed(table)))
    d = policy(dataclasses.replace(features, seq=seq), FleetSnapshot(views))
    assert set(d.predicted) >= {"ttft_ms", "e2e_ms", "quality", "output_tokens"}
    return d.ranked


def feats(**kw: object) -> RequestFeatures:
    return RequestFeatures(agent="a", endpoint="chat", models=("m",), prompt_tokens=100, max_tokens=None,
                           stream=True, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_chimera_rule_most_capable_within_slack_of_the_fastest() -> None:
    assert decide(feats())[0] == "good"  # best is 1.4x the fastest: outside the 1.3 slack
    assert decide(feats(), slack=1.5)[0] == "best"
    assert decide(feats(), slack=1.0)[0] == "fast"
    assert decide(feats())[1:] == ("fast", "best", "slow")  # fallbacks by predicted e2e


def test_expected_cost_weighs_the_chance_of_a_wrong_answer() -> None:
    # e2e p50 (0.8 x p90): fast 800, good 1000, best 1120, slow 4000 ms; a wrong answer costs 3.2 s.
    assert decide(feats(), wrong_s=3.2) == ("best", "good", "fast", "slow")  # 1280 < 1640 < 2400 < 4032
    assert decide(feats(), wrong_s=0.4)[0] == "fast"  # 1000 < 1080 < 1140: a wrong answer is cheap
    easy = {name: (e2e, ttft, 0.97 + 0.005 * i) for i, (name, (e2e, ttft, _)) in enumerate(TABLE.items())}
    assert decide(feats(), easy, wrong_s=3.2)[0] == "fast"  # everyone gets it right: the fastest
    assert PolicyOptions().wrong_answer_s > 0  # the default rule


def test_a_wrong_answer_costs_more_later_in_a_workflow() -> None:
    """wrong_answer_stage_s adds to the cost per workflow stage (x-workflow-stage): the same prompt goes
    to the fast worker at the start of a workflow and to the capable one late in it."""
    policy = make_predictive(
        PolicyOptions(wrong_answer_s=0.4, wrong_answer_stage_s=0.5, spread_margin=0), ModelSlot(Fixed(TABLE))
    )
    at = lambda stage: policy(feats(workflow_stage=stage), FleetSnapshot(VIEWS)).ranked[0]  # noqa: E731
    assert at(None) == at(0) == "fast"  # 0.4 s: 1000 < 1080 < 1140 (e2e p50 + P(wrong) x cost)
    assert at(6) == "best"  # 3.4 s: 1120 + 170 < 1000 + 680 < 800 + 1700
    assert at(10_000) == at(16) == "best"  # capped at MAX_STAGE (uncapped, the 0.99 "slow" would win)
    no_stage = make_predictive(PolicyOptions(wrong_answer_s=0.4, spread_margin=0), ModelSlot(Fixed(TABLE)))
    assert no_stage(feats(workflow_stage=6), FleetSnapshot(VIEWS)).ranked[0] == "fast"  # off by default
    slack_rule = make_predictive(
        PolicyOptions(wrong_answer_s=0, wrong_answer_stage_s=0.5, spread_margin=0), ModelSlot(Fixed(TABLE))
    )
    assert slack_rule(feats(workflow_stage=6), FleetSnapshot(VIEWS)).ranked[0] == "good"  # Chimera's rule at any stage


def test_feedback_prices_each_worker_as_its_requests_ran() -> None:
    """A worker whose recent answers decoded 1.5x slower than predicted loses the expected-cost tie it
    won on the estimator's numbers alone; its reported prediction is the corrected one, and the
    estimator's own TTFT / decode per token go with it (what the gateway compares the timings with)."""
    table = {"fast": (1000, 100, 0.5), "good": (1200, 100, 0.7)}
    views = tuple(BackendView(name=n, model="m") for n in table)
    assert decide(feats(), table, views=views, wrong_s=2.0)[0] == "good"  # 960 + 600 < 800 + 1000
    slow = (views[0], BackendView(name="good", model="m", tpot_bias=1.5))
    assert decide(feats(), table, views=slow, wrong_s=2.0)[0] == "fast"  # 80 + 880 x 1.5 + 600 > 1800
    policy = make_predictive(PolicyOptions(wrong_answer_s=2.0, spread_margin=0), ModelSlot(Fixed(table)))
    d = policy(feats(), FleetSnapshot((views[0], BackendView(name="good", model="m", ttft_bias=2.0))))
    assert d.ranked[0] == "good"
    assert d.predicted["ttft_ms"] == pytest.approx(160.0) and d.predicted["ttft_model_ms"] == pytest.approx(80.0)
    assert d.predicted["e2e_ms"] == pytest.approx(1040.0)  # the decode part as predicted
    assert d.predicted["tpot_model_ms"] == pytest.approx((960 - 80) / 99)  # e2e's decode part per token
    off = make_predictive(
        PolicyOptions(wrong_answer_s=2.0, latency_feedback=False, spread_margin=0), ModelSlot(Fixed(table))
    )
    assert off(feats(), FleetSnapshot(slow)).ranked[0] == "good"
    assert "ttft_model_ms" not in off(feats(), FleetSnapshot(slow)).predicted


def test_sla_and_min_quality_filter_before_the_rule() -> None:
    assert decide(feats(ttft_slo_ms=130), wrong_s=3.2)[0] == "best"  # good misses the TTFT objective
    assert decide(feats(ttft_slo_ms=130))[0] == "fast"  # Chimera's rule: best is outside the slack
    assert decide(feats(min_quality=0.9))[0] == "best"
    assert decide(feats(e2e_slo_ms=1100), wrong_s=3.2)[0] == "fast"  # the only one predicted to meet it
    # Fallbacks: the other SLA-meeting workers by expected cost, then the late ones by lateness.
    assert decide(feats(e2e_slo_ms=1300), wrong_s=3.2) == ("good", "fast", "best", "slow")


def test_tpot_slo_is_checked() -> None:
    # The stub's TPOT p90 is TTFT p90 / 10: fast 10, good 15, best 12, slow 90 ms.
    assert decide(feats(tpot_slo_ms=11))[0] == "fast"
    assert decide(feats(tpot_slo_ms=13), wrong_s=3.2)[0] == "best"


def test_slos_are_compared_in_modelled_time() -> None:
    # A sim at speedup 0.5 (time_scale 2): wall-clock predictions are twice the modelled ones.
    slow_clock = {v.name: profile_for(None, "qwen2.5-7b", 2.0) for v in VIEWS}
    policy = make_predictive(PolicyOptions(wrong_answer_s=1.6, spread_margin=0), ModelSlot(Fixed(TABLE)), slow_clock)
    assert policy(feats(e2e_slo_ms=800), FleetSnapshot(VIEWS)).ranked[0] == "best"  # 1400 wall = 700 modelled
    assert decide(feats(e2e_slo_ms=800))[0] == "fast"  # at time_scale 1 nobody meets it: least lateness


def test_nobody_meets_the_sla_least_lateness_wins() -> None:
    ranked = decide(feats(ttft_slo_ms=50, e2e_slo_ms=500))
    assert ranked[0] == "fast" and ranked[-1] == "slow"


def test_load_guard_drops_affinity_of_a_hot_worker() -> None:
    views = (BackendView(name="hot", model="m", inflight_requests=20), BackendView(name="cold", model="m"))
    f = feats(prefix_hits={"hot": 0.9, "cold": 0.5})
    shares = guarded_shares(f, views, PolicyOptions(affinity_load_ratio=2.0, affinity_load_slack=4))
    assert shares.tolist() == [0.0, 0.5]


def test_registry_builds_a_prior_policy_that_prefers_the_idle_worker() -> None:
    config = make_config([{"name": n, "url": f"http://127.0.0.1:{i + 1}", "model": "qwen2.5-7b"}
                          for i, n in enumerate(("busy", "idle"))], policy="predictive")  # fmt: skip
    policy = create_policy(config)
    views = (BackendView(name="busy", model="qwen2.5-7b", running=100, inflight_requests=100, inflight_tokens=90_000),
             BackendView(name="idle", model="qwen2.5-7b", running=0))  # fmt: skip
    d = policy(feats(), FleetSnapshot(views))
    assert d.ranked == ("idle", "busy") and d.reason.startswith("predictive")


def test_decision_micro_benchmark_over_8_workers() -> None:
    """A benchmark, not a timed assertion: prints the p50 of a fitted predictor's decision."""
    from predictor.latency import LatencyModel
    from predictor.length import OutputLengthModel

    with threadpool_limits(limits=1, user_api="openmp"):  # as the gateway's refits run
        fitted = Predictor(length=OutputLengthModel(min_samples=20), latency=LatencyModel(min_samples=20)).fit(
            samples(records(300)))  # fmt: skip
    models = ("qwen2.5-0.5b", "qwen2.5-7b")
    views = tuple(BackendView(name=f"w{i}", model=models[i % 2], running=i, waiting=0, kv_usage=0.05 * i,
                              inflight_requests=i, inflight_tokens=600 * i) for i in range(8))  # fmt: skip
    policy = make_predictive(PolicyOptions(), ModelSlot(fitted), {v.name: profile_for(None, v.model) for v in views})
    f = samples(records(1))[0].features
    f = RequestFeatures(**{**{k: getattr(f, k) for k in f.__slots__}, "models": models, "e2e_slo_ms": 30000.0})  # type: ignore[arg-type]
    snap = FleetSnapshot(views)
    for _ in range(50):
        policy(f, snap)
    times = []
    for _ in range(300):
        t = time.perf_counter()
        policy(f, snap)
        times.append(time.perf_counter() - t)
    print(f"\npredictive decision over 8 workers: p50 {np.median(times) * 1e6:.0f} us, "
          f"p99 {np.quantile(times, 0.99) * 1e6:.0f} us")  # fmt: skip
    assert len(policy(f, snap).ranked) == 8


def test_near_ties_are_split_by_how_close_they_are() -> None:
    """spread_margin: workers within the margin of the least expected cost share the first place, a tie evenly
    and the margin's edge at 0.3 of a tied one's weight; beyond it the least always wins. The split is drawn from
    the gateway's request counter, so a decision is a pure function of its inputs."""
    views = tuple(BackendView(name=n, model="m") for n in ("a", "b"))

    def shares(b_e2e: float, spread: float = 0.1) -> float:
        table = {"a": (1000.0, 100.0, 0.5), "b": (b_e2e, 100.0, 0.5)}  # same quality: the costs differ by e2e
        firsts = [decide(feats(), table, views=views, wrong_s=2.0, spread=spread, seq=i)[0] for i in range(2000)]
        return firsts.count("b") / len(firsts)

    assert shares(1000.0) == pytest.approx(0.5, abs=0.04)  # a tie: evenly
    # cost = e2e p50 (0.8 x p90) + 0.5 x 2000: a 1.09 x the e2e of a is a 4 % higher cost: weight 1 - 0.7 x 0.4
    assert shares(1090.0) == pytest.approx(0.72 / 1.72, abs=0.04)
    assert shares(1210.0) == pytest.approx(0.347 / 1.347, abs=0.04)  # a cost 9.3 % above: more than 15 % of steps
    assert shares(1240.0) == 0.0  # 10.7 %: outside the margin
    assert shares(1000.0, spread=0.0) == 0.0  # off: the least (the first listed on a tie)
    same = [decide(feats(), {"a": TABLE["fast"], "b": TABLE["fast"]}, views=views, wrong_s=2.0, spread=0.1, seq=7)
            for _ in range(3)]  # fmt: skip
    assert len(set(same)) == 1  # the same request, the same decision
    # the fallbacks after the drawn first place keep their order
    three = tuple(BackendView(name=n, model="m") for n in ("a", "b", "c"))
    table3 = {"a": (1000.0, 100.0, 0.5), "b": (1000.0, 100.0, 0.5), "c": (3000.0, 100.0, 0.5)}
    assert {decide(feats(), table3, views=three, wrong_s=2.0, spread=0.1, seq=i)[1:] for i in range(50)} == {
        ("b", "c"), ("a", "c")}  # fmt: skip


def test_chimera_rule_spreads_over_equally_capable_workers() -> None:
    """Under wrong_answer_s: 0, the spread is among the chosen worker's equals in quality (replicas of its model)
    within the margin of its p90 e2e; a more capable worker is never traded for a faster one by it."""
    views = tuple(BackendView(name=n, model="m") for n in ("r1", "r2", "small"))
    table = {"r1": (1000.0, 100.0, 0.8), "r2": (1050.0, 100.0, 0.8), "small": (900.0, 100.0, 0.5)}
    firsts = [decide(feats(), table, views=views, spread=0.1, seq=i)[0] for i in range(1000)]
    assert set(firsts) == {"r1", "r2"} and 0.3 < firsts.count("r2") / 1000 < 0.5


def test_the_decision_says_how_near_the_runner_up_was() -> None:
    views = tuple(BackendView(name=n, model="m") for n in ("a", "b"))
    table = {"a": (1000.0, 100.0, 0.5), "b": (1090.0, 100.0, 0.5)}  # costs 1800 and 1872 ms
    policy = make_predictive(PolicyOptions(wrong_answer_s=2.0, spread_margin=0.0), ModelSlot(Fixed(table)))
    decided = policy(feats(), FleetSnapshot(views))
    assert decided.ranked == ("a", "b") and decided.predicted["cost_gap"] == pytest.approx(0.04)
    assert decided.predicted["runner_up_e2e_ms"] == pytest.approx(0.8 * 1090.0)  # its p50
    assert decided.predicted["runner_up_quality"] == pytest.approx(0.5)
    # a near tie drawn for the dearer one: the runner-up (the cheaper) is cheaper than the choice
    spread = make_predictive(PolicyOptions(wrong_answer_s=2.0, spread_margin=0.1), ModelSlot(Fixed(table)))
    drawn = [spread(feats(seq=i), FleetSnapshot(views)) for i in range(40)]
    assert {(d.ranked[0], round(d.predicted["cost_gap"], 4)) for d in drawn} == {("a", 0.04), ("b", -0.0385)}
    chimera = make_predictive(PolicyOptions(wrong_answer_s=0), ModelSlot(Fixed(table)))
    assert "cost_gap" not in chimera(feats(), FleetSnapshot(views)).predicted


def test_a_declared_quality_is_what_the_policy_weighs() -> None:
    """Two workers of models the router knows nothing of borrow one default profile, so they look alike; the
    `quality` each backend declares is what the expected cost weighs against speed."""
    backends = [{"name": n, "url": f"http://127.0.0.1:{9000 + i}", "model": n, "quality": q}
                for i, (n, q) in enumerate((("weak", 0.3), ("strong", 0.95)))]  # fmt: skip
    agents = [{"name": "a", "models": ["weak", "strong"]}]
    views = tuple(BackendView(name=b["name"], model=b["name"]) for b in backends)
    f = RequestFeatures(agent="a", endpoint="chat", models=("weak", "strong"), prompt_tokens=200, max_tokens=100,
                        stream=True)  # fmt: skip
    ranked = create_policy(make_config(backends, agents, policy="predictive"), None)(f, FleetSnapshot(views)).ranked
    assert ranked[0] == "strong"
    for b in backends:
        b.pop("quality")
    alike = create_policy(make_config(backends, agents, policy="predictive", policy_options={"spread_margin": 0}), None)
    assert alike(f, FleetSnapshot(views)).ranked[0] == "weak"  # a tie without it: the first listed


def test_a_priced_sla_lets_a_capable_worker_that_may_be_late_win() -> None:
    f = feats(e2e_slo_ms=1200.0)  # only "fast" (p90 1000 ms) is predicted within it; "best" has p90 1400, p50 1120

    def first(miss_s: float | None) -> str:
        options = PolicyOptions(wrong_answer_s=5.0, sla_miss_s=miss_s, spread_margin=0.0)
        return make_predictive(options, ModelSlot(Fixed(TABLE)))(f, FleetSnapshot(VIEWS)).ranked[0]

    assert first(None) == "fast"  # the SLA a constraint: the one predicted within it
    assert first(0.1) == "best"  # a miss costs 0.1 s, a wrong answer 5 s: P(miss) 0.35 is worth 95 % quality
    assert first(100.0) == "fast"  # a miss costs 100 s: the one least likely late (P 0.01)


def test_the_miss_probability_follows_the_predicted_quantiles() -> None:
    from router.policies.predictive import miss_probability

    assert miss_probability(1000.0, 1250.0, 1250.0) == pytest.approx(0.1)
    assert miss_probability(1000.0, 1250.0, 1000.0) == pytest.approx(0.5)
    assert miss_probability(1000.0, 1000.0, 900.0) == 1.0 and miss_probability(1000.0, 1000.0, 1100.0) == 0.0

