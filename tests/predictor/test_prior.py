"""The analytic cold-start prior routes sensibly before any training."""

from __future__ import annotations

from dataclasses import replace

from predictor.model import PriorPredictor
from predictor.prior import prior_latency, prior_output, profile_for
from router.core.types import BackendView, RequestFeatures

F = RequestFeatures(agent="a", endpoint="chat", models=("m",), prompt_tokens=1000, max_tokens=300, stream=True)


def view(load: int = 0, **kw: object) -> BackendView:
    return BackendView(name="w", model="qwen2.5-7b", running=load, waiting=0, inflight_requests=load,
                       inflight_tokens=load * 800, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_more_load_means_higher_ttft_and_tpot() -> None:
    wp = profile_for("h200-qwen2.5-7b")
    idle, busy, queued = (prior_latency(wp, view(n), 1000, 0.0) for n in (0, 64, 2000))
    assert idle[0] < busy[0] < queued[0]
    assert idle[1] < busy[1]
    # KV pressure adds to TTFT at the same load
    assert prior_latency(wp, view(64, kv_usage=0.99), 1000, 0.0)[0] > busy[0]


def test_a_prefill_backlog_delays_the_first_token() -> None:
    """Two workers with the same running count: the one still prefilling an 8k-token document makes a
    new short prompt wait for it (vLLM runs it; its waiting count stays 0), the TPOT is the same."""
    wp = profile_for("h200-qwen2.5-7b")
    free = prior_latency(wp, view(2), 200, 0.0)
    backlog = prior_latency(wp, view(2, pending_prefill_tokens=8000), 200, 0.0)
    # (less the eager floor the short prompt's own step pays alone: the backlog's long steps absorb it)
    assert backlog[0] - free[0] > 8000 * wp.prefill - wp.eager_floor and backlog[1] == free[1]


def test_a_queued_streamed_prompt_is_counted_once() -> None:
    """Above max_num_seqs the worker's waiting requests are also this gateway's pending prefills: the TTFT
    queues behind those prompts once (the larger estimate), not behind their sum."""
    wp = profile_for("h200-qwen2.5-7b")
    n = wp.max_num_seqs + 10
    queued = BackendView(name="w", model="qwen2.5-7b", running=wp.max_num_seqs, waiting=10, inflight_requests=n,
                         inflight_tokens=n * 2000)  # fmt: skip
    pending = 10 * 1000  # the 10 waiting requests' prompts (half of each 2,000-token reservation)
    both = prior_latency(wp, replace(queued, pending_prefill_tokens=pending), 200, 0.0)
    assert both == prior_latency(wp, queued, 200, 0.0)  # the same prompts, counted once
    more = prior_latency(wp, replace(queued, pending_prefill_tokens=3 * pending), 200, 0.0)
    assert more[0] > both[0]  # a larger backlog than the queue shows still counts in full


def test_bigger_model_is_slower_and_better() -> None:
    small, big = profile_for("h200-qwen2.5-0.5b"), profile_for("h200-qwen2.5-14b")
    for load in (0, 32):
        s, b = prior_latency(small, view(load), 2000, 0.0), prior_latency(big, view(load), 2000, 0.0)
        assert s[0] < b[0] and s[1] < b[1]
    assert small.quality < big.quality


def test_cached_prefix_and_time_scale() -> None:
    wp = profile_for("h200-qwen2.5-7b")
    assert prior_latency(wp, view(), 8000, 0.9)[0] < prior_latency(wp, view(), 8000, 0.0)[0]
    slow = profile_for("h200-qwen2.5-7b", time_scale=4.0)  # a sim at speedup 0.25
    assert abs(prior_latency(slow, view(), 1000, 0.0)[1] - 4 * prior_latency(wp, view(), 1000, 0.0)[1]) < 1e-12


def test_unknown_model_gets_a_default_profile_and_output_is_capped() -> None:
    assert profile_for(None, "qwen2.5-1.5b").name == "h200-qwen2.5-1.5b"
    assert profile_for(None, "mystery-model").name == "h200-qwen2.5-7b"
    assert prior_output(100) == (100.0, 100.0) and prior_output(None)[1] > prior_output(None)[0]
    views = (view(0), view(40))
    p = PriorPredictor().predict(F, views, (profile_for("h200-qwen2.5-7b"),) * 2)
    assert p.e2e[0, 0] < p.e2e[1, 0] and (p.e2e[:, 1] >= p.e2e[:, 0]).all() and (p.output[:, 1] <= 300).all()


def test_backend_profile_key_is_validated_and_resolved() -> None:
    import pytest

    from predictor.prior import worker_profiles
    from router.core.config import parse_config
    from router.core.errors import ConfigError

    text = """
gateway: {policy: predictive, default_agent: a}
backends:
  - {name: real, url: "http://127.0.0.1:9", model: m, kv_budget_tokens: 1000, profile: PROFILE}
  - {name: sim, url: "http://127.0.0.1:10", model: qwen2.5-14b, kv_budget_tokens: 1000,
     sim: {profile: h200-qwen2.5-14b, speedup: 0.5}}
agents:
  - {name: a, models: [m]}
"""
    with pytest.raises(ConfigError, match=r":4: backends\[real\]\.profile: unknown profile 'nope'"):
        parse_config(text.replace("PROFILE", "nope"), env={})
    cfg = parse_config(text.replace("PROFILE", "h200-qwen2.5-0.5b"), env={})
    wps = worker_profiles(cfg)
    assert wps["real"].name == "h200-qwen2.5-0.5b" and wps["real"].time_scale == 1.0
    assert wps["sim"].name == "h200-qwen2.5-14b" and wps["sim"].time_scale == 2.0
    assert wps["real"].quality == profile_for("h200-qwen2.5-0.5b").quality  # the profile's, unless declared
    declared = text.replace("PROFILE", "h200-qwen2.5-0.5b").replace("1000, profile", "1000, quality: 0.9, profile")
    rated = parse_config(declared, env={})
    assert worker_profiles(rated)["real"].quality == 0.9 and worker_profiles(rated)["sim"].quality == wps["sim"].quality
    assert profile_for("h200-qwen2.5-0.5b").quality != 0.9  # the shared, cached profile is left as it was


def test_a_busy_engine_adds_the_step_in_progress_and_the_api_servers_streaming() -> None:
    """The shipped profiles run vLLM's async scheduling and fit the API server's streaming work: on a busy
    worker a request waits the rest of the step in progress and the step already planned (1.5 steps), and
    ``stream_wait * rho / (1 - rho)`` for the tokens the running requests stream (rho capped as the sim caps
    it); an idle worker waits for neither. The whole TTFT scales with the time scale (rho does not)."""
    from router.core.profile import STREAM_RHO_MAX, eager_step

    wp = profile_for("h200-qwen2.5-0.5b")
    assert wp.busy_wait_steps == 1.5 and wp.stream_token > 0 and wp.stream_wait > 0
    plain = replace(wp, busy_wait_steps=0.0, stream_token=0.0, stream_wait=0.0)
    assert prior_latency(wp, view(0), 500, 0.0) == prior_latency(plain, view(0), 500, 0.0)
    for n, capped in ((8, False), (wp.max_num_seqs, True)):
        step = eager_step(
            wp.base + wp.decode_seqs * n + wp.decode_ctx * n * 400,
            n,
            wp.graph_max,
            wp.eager_floor,
            wp.eager_extra,
            wp.eager_token,
        )  # view(): 800 tokens a request, half done
        rho = wp.stream_token * n / step
        assert (rho >= STREAM_RHO_MAX) is capped
        rho = min(rho, STREAM_RHO_MAX)
        extra = prior_latency(wp, view(n), 500, 0.0)[0] - prior_latency(plain, view(n), 500, 0.0)[0]
        assert abs(extra - (1.5 * step + wp.stream_wait * rho / (1 - rho))) < 1e-12
        assert prior_latency(wp, view(n), 500, 0.0)[1] == prior_latency(plain, view(n), 500, 0.0)[1]
    sync = replace(plain, busy_wait_steps=0.5)
    busy = prior_latency(sync, view(8), 500, 0.0)[0] - prior_latency(plain, view(8), 500, 0.0)[0]
    assert abs(busy - 0.5 * (wp.base + wp.decode_seqs * 8 + wp.decode_ctx * 8 * 400)) < 1e-12
    slow = profile_for("h200-qwen2.5-0.5b", time_scale=4.0)
    assert abs(prior_latency(slow, view(8), 500, 0.0)[0] - 4 * prior_latency(wp, view(8), 500, 0.0)[0]) < 1e-12


def test_an_idle_workers_ttft_is_the_sims() -> None:
    """On an idle worker the prior's TTFT is what the sim's engine models for the same profile: the API
    server's constant and intake, then one prefill step, eager above the CUDA-graph limit (a 1,000-token
    prompt pays the eager step's ~17-23 ms; 64 tokens run in the graphs), plus the measured HTTP share."""
    from backends.sim.engine import Engine, Request
    from backends.sim.textgen import Answer
    from router.core.profile import load_profile

    for name in ("h200-qwen2.5-0.5b", "h200-qwen2.5-7b"):
        profile = load_profile(name)
        for n in (64, 1000):
            engine = Engine(profile, kv_tokens=profile.kv_budget_tokens, max_num_seqs=profile.max_num_seqs,
                            max_num_batched_tokens=profile.max_num_batched_tokens, speedup=1.0, seed=0)  # fmt: skip
            queued = engine.frontend_exit(0.0, n)
            engine.enqueue(Request("r", list(range(n)), Answer(2, word_start=0, marker=None), max_tokens=2), queued)
            sim = queued + engine.step(queued).duration + profile.sim_http_s
            prior = prior_latency(profile_for(name), view(0), n, 0.0)[0]
            assert abs(prior - sim) < 1e-9, (name, n, prior, sim)
            assert (n > profile.cudagraph.max_tokens) == (prior > 0.015 + profile.ttft_overhead_s)  # type: ignore[union-attr]


def test_an_idle_workers_prefill_pays_no_eager_extra_a_busy_ones_does() -> None:
    """The shipped profiles charge ``eager_extra`` only to eager steps that decode (``eager_extra_decode_only``):
    a prompt on an idle worker prefills alone, one on a busy worker shares its steps with the decoders."""
    wp = profile_for("h200-qwen2.5-14b")
    assert wp.eager_extra > 0 and wp.prefill_extra == 0.0
    charged = replace(wp, prefill_extra=wp.eager_extra)  # a profile without the flag
    idle, idle_charged = (prior_latency(w, view(0), 1000, 0.0)[0] for w in (wp, charged))
    assert abs(idle_charged - idle - wp.eager_extra) < 1e-12
    busy, busy_charged = (prior_latency(w, view(8), 1000, 0.0)[0] for w in (wp, charged))
    assert busy == busy_charged
