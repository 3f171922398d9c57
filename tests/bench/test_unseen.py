"""`chimera bench --unseen`: the gateway is configured as in front of workers it has never seen."""

from __future__ import annotations

from pathlib import Path

import pytest

from chimera_bench.client import posts_feedback
from chimera_bench.gateway_proc import unseen
from router.core.config import load_config
from router.core.profile import load_profile
from router.policies import USES_PREDICTOR

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _at_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example's sim profiles are paths from the repository's root, as its command runs


def test_the_gateway_gets_no_sim_profile_speedup_or_quality_and_wall_clock_figures():
    cfg = load_config("examples/bench-unseen.yaml")
    assert all(b.sim is not None and b.sim.speedup == 0.5 for b in cfg.backends)
    blind = unseen(cfg.model_copy(update={"backends": (cfg.backends[0].model_copy(update={"quality": 0.9}),
                                                       *cfg.backends[1:])}))  # fmt: skip
    for b, was in zip(blind.backends, cfg.backends, strict=True):
        assert (b.sim, b.profile, b.quality, b.profile_name, b.time_scale) == (None, None, None, None, 1.0)
        assert (b.name, b.url, b.model, b.kv_budget_tokens) == (was.name, was.url, was.model, was.kv_budget_tokens)
    for a, was in zip(blind.agents, cfg.agents, strict=True):  # modelled time / speedup 0.5
        assert (a.sla.ttft_ms, a.sla.e2e_ms) == (2 * was.sla.ttft_ms, 2 * was.sla.e2e_ms)
    assert blind.gateway.policy_options.wrong_answer_s == 2 * cfg.gateway.policy_options.wrong_answer_s
    assert blind.gateway.policy_options.sla_miss_s is None


def test_a_priced_sla_is_handed_over_in_wall_clock_time():
    cfg = load_config("examples/bench-unseen.yaml")
    po = cfg.gateway.policy_options.model_copy(update={"sla_miss_s": 3.0, "wrong_answer_stage_s": 1.5})
    blind = unseen(cfg.model_copy(update={"gateway": cfg.gateway.model_copy(update={"policy_options": po})}))
    got = blind.gateway.policy_options
    assert (got.sla_miss_s, got.wrong_answer_stage_s) == (6.0, 3.0)  # modelled seconds / speedup 0.5


def test_the_unseen_fleets_models_have_no_shipped_profile_and_their_sims_load():
    from predictor.prior import profile_choice

    cfg = load_config("examples/bench-unseen.yaml")
    for b in unseen(cfg).backends:
        assert profile_choice(b.profile_name, b.model)[1] == "default"
    qualities = [load_profile(b.sim.profile).quality for b in cfg.backends if b.sim is not None]
    assert len(set(qualities)) == len(qualities)  # the models differ in what they answer, not only in speed


def test_verdicts_are_posted_where_the_gateway_keeps_a_predictor():
    cfg = load_config("examples/bench-unseen.yaml")
    assert cfg.gateway.predictor is not None  # it refits on the fleet's own traffic: every policy gets verdicts
    assert posts_feedback(cfg, "least_outstanding")
    bare = cfg.model_copy(update={"gateway": cfg.gateway.model_copy(update={"predictor": None})})
    assert posts_feedback(bare, "predictive") and "predictive" in USES_PREDICTOR
    assert not posts_feedback(bare, "least_outstanding")
