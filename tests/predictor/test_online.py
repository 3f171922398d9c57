"""The step times and answer quality the gateway learns of a worker with no profile (predictor.online)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from predictor.online import QualityTally, StepLearner, learned_start
from predictor.prior import prior_latency, profile_for
from router.core.types import BackendView


def _view(rng: random.Random) -> tuple[BackendView, dict[str, float]]:
    n = rng.randint(0, 48)
    tokens = n * rng.randint(200, 2000)
    pending = rng.choice([0, 0, rng.randint(100, 4000)])
    view = BackendView(name="w", model="m", kv_budget_tokens=10**6, inflight_requests=n, inflight_tokens=tokens,
                       pending_prefill_tokens=pending, running=n, waiting=0)  # fmt: skip
    fleet = {"inflight_requests": n, "inflight_tokens": tokens, "pending_prefill_tokens": pending, "running": n,
             "waiting": 0}  # fmt: skip
    return view, fleet


@pytest.mark.parametrize("shape", ["h200-qwen2.5-0.5b", "h200-qwen2.5-14b"])
def test_a_worker_learns_its_own_step_times_from_the_default_start(shape):
    """Answers timed as a worker of another shape runs teach the learner that shape's TTFT and TPOT (within 3 %
    over fresh loads), starting from the default profile's terms, which are off by up to 2-3x."""
    truth = learned_start(profile_for(shape), "truth")
    learner = StepLearner(learned_start(profile_for(None, "unknown-model"), "learned:w"))
    rng = random.Random(7)

    def errors(wp):
        out = []
        for _ in range(200):
            view, _ = _view(rng)
            prompt = rng.randint(50, 3000)
            (t_true, p_true), (t, p) = prior_latency(truth, view, prompt, 0.0), prior_latency(wp, view, prompt, 0.0)
            out += [abs(t / t_true - 1), abs(p / p_true - 1)]
        return max(out)

    before = errors(learner.profile)
    for _ in range(200):
        view, fleet = _view(rng)
        prompt, out = rng.randint(50, 3000), rng.randint(20, 600)
        ttft, tpot = prior_latency(truth, view, prompt, 0.0)
        learner.observe(fleet, prompt, 0.0, out, ttft, ttft + (out - 1) * tpot)
    assert learner.learned and learner.samples == 200
    assert before > 0.5
    assert errors(learner.profile) < 0.03


def test_unstreamed_answers_teach_the_decode_terms():
    truth = learned_start(profile_for("h200-qwen2.5-0.5b"), "truth")
    learner = StepLearner(learned_start(profile_for(None, "x"), "learned:w"), min_samples=10)
    rng = random.Random(3)
    for _ in range(60):
        view, fleet = _view(rng)
        prompt, out = rng.randint(50, 1000), rng.randint(50, 600)
        ttft, tpot = prior_latency(truth, view, prompt, 0.0)
        learner.observe(fleet, prompt, 0.0, out, None, ttft + (out - 1) * tpot)
    assert learner.learned
    assert learner.profile.base == pytest.approx(truth.base, rel=0.25)
    short = StepLearner(learned_start(profile_for(None, "x"), "learned:w"), min_samples=1)
    assert not short.observe({}, 100, 0.0, 3, None, 0.5)  # too short to say anything
    assert short.samples == 0


def test_learned_start_keeps_the_limits_and_drops_what_answers_cannot_teach():
    base = profile_for(None, "x")
    start = learned_start(base, "learned:w")
    assert (start.name, start.max_num_seqs, start.base) == ("learned:w", base.max_num_seqs, base.base)
    assert start.graph_max == 0 and start.stream_wait == 0.0 and start.intake == 0.0
    assert dataclasses.replace(start, quality=0.3).quality == 0.3


def test_a_quality_tally_starts_optimistic_and_follows_the_verdicts():
    t = QualityTally()
    assert t.value == 1.0
    for i in range(100):
        t.add(1.0 if i % 2 else 0.0)
    assert t.value == pytest.approx(0.5, abs=0.03)
    declared = QualityTally(0.8, 20.0)
    declared.add(0.0)
    assert declared.value == pytest.approx(16 / 21)
    assert QualityTally().add(7.0) == 1.0  # a score is clipped to [0, 1]
