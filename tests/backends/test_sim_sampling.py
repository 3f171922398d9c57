"""The sampler's cost (profile ``sampling_s``) and the speedup-proof TTFT constant (``overhead_s.sim_http``):
stepped engines for the exact numbers, a real uvicorn and the openai SDK for what a client sees."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import openai
import pytest

from backends.sim.engine import Engine, Request
from backends.sim.textgen import Answer
from router.core.errors import ProfileError
from router.core.profile import load_profile
from tests.conftest import ServerThread

MakeEngine = Callable[..., Engine]
SimServer = Callable[..., ServerThread]
Profile = Callable[..., str]

CPU_BOUND = {"random": 0.002, "min_tokens": 0.001}  # no cpu_base: the whole step is CPU, the cost adds in full


def request(out: int, tag: int = 0, random: bool = False, min_tokens: int = 0) -> Request:
    ids = [tag * 1_000_000 + i for i in range(32)]
    answer = Answer(out, word_start=tag, marker=None)
    return Request(f"r{tag}", ids, answer, max_tokens=out, min_tokens=min_tokens, random=random)


def durations(engine: Engine, *reqs: Request) -> list[float]:
    for r in reqs:
        engine.enqueue(r)
    out, t = [], 0.0
    while not engine.idle:
        batch = engine.step(t)
        out.append(batch.duration)
        t += batch.duration
    return out


def test_a_cpu_bound_engine_pays_the_sampling_cost_in_full(make_engine: MakeEngine) -> None:
    greedy = durations(make_engine(sampling_s=CPU_BOUND), request(4))
    sampled = durations(make_engine(sampling_s=CPU_BOUND), request(4, random=True))
    assert len(greedy) == len(sampled) == 4  # the prefill step (samples the first token) and three decode steps
    assert sampled == pytest.approx([g + 0.002 for g in greedy], abs=1e-12)


def test_min_tokens_costs_only_while_the_request_is_short_of_it(make_engine: MakeEngine) -> None:
    greedy = durations(make_engine(sampling_s=CPU_BOUND), request(5))
    held = durations(make_engine(sampling_s=CPU_BOUND), request(5, min_tokens=3))
    # output lengths at the five steps: 0, 1, 2 (< 3: the processor runs), then 3, 4 (it has let go)
    assert [h - g for h, g in zip(held, greedy, strict=True)] == pytest.approx([0.001] * 3 + [0.0] * 2, abs=1e-12)


def test_a_gpu_bound_step_hides_the_cpu_work_up_to_its_length(make_engine: MakeEngine) -> None:
    # a decode step lasts 4 ms + 0.1 ms; the engine's CPU time is 1 ms (+0.05 ms per request)
    hidden = {"random": 0.002, "cpu_base": 0.001, "cpu_per_seq": 5e-5}
    greedy = durations(make_engine(sampling_s=hidden), request(3))
    assert durations(make_engine(sampling_s=hidden), request(3, random=True)) == pytest.approx(greedy, abs=1e-12)
    # 1.05 + 3.5 ms of CPU outlasts the 4.1 ms decode step: the step is CPU-bound by 0.45 ms
    over = dict(hidden, random=0.0035)
    sampled = durations(make_engine(sampling_s=over), request(3, random=True))
    assert sampled[1:] == pytest.approx([0.00455, 0.00455], abs=1e-12)
    assert sampled[0] == pytest.approx(greedy[0], abs=1e-12)  # the prefill step (32 tokens: 4.64 ms) hides it


def test_an_eager_step_is_launch_bound_and_pays_in_full(make_engine: MakeEngine) -> None:
    sec = {"random": 0.002, "cpu_base": 0.0001}
    cg = {"max_tokens": 16, "eager_floor_s": 0.01}
    greedy = durations(make_engine(sampling_s=sec, cudagraph=cg), request(2))
    sampled = durations(make_engine(sampling_s=sec, cudagraph=cg), request(2, random=True))
    assert sampled[0] == pytest.approx(greedy[0] + 0.002, abs=1e-12)  # 32 prefill tokens > 16: eager
    assert sampled[1] == pytest.approx(greedy[1], abs=1e-12)  # one decode token: inside the graphs, hidden


def test_a_step_with_any_random_request_pays_once(make_engine: MakeEngine) -> None:
    mixed = durations(make_engine(sampling_s=CPU_BOUND), request(3, 1), request(3, 2, random=True))
    greedy = durations(make_engine(sampling_s=CPU_BOUND), request(3, 1), request(3, 2))
    assert mixed == pytest.approx([g + 0.002 for g in greedy], abs=1e-12)


def test_profiles_without_the_section_time_every_request_alike(make_engine: MakeEngine) -> None:
    plain = make_engine()
    assert plain.profile.sampling is None and plain.profile.sim_http_s == 0.0
    greedy = durations(make_engine(), request(4))
    assert durations(make_engine(), request(4, random=True, min_tokens=4)) == greedy
    c = plain.profile.step_time
    assert greedy[1:] == [c.base + c.decode_seqs] * 3  # the linear model, exactly as before


def test_sim_http_keeps_the_ttft_constant_in_modelled_time(make_engine: MakeEngine) -> None:
    ovh = {"ttft": 0.01, "sim_http": 0.003}
    assert make_engine(overhead_s=ovh).frontend_exit(0.0, 10) == pytest.approx(0.01)
    assert make_engine(overhead_s={"ttft": 0.01}, speedup=0.25).frontend_exit(0.0, 10) == pytest.approx(0.04)
    # at speedup 0.25 the sim's own 3 ms (wall) count 0.75 ms of modelled time: the engine adds the other 2.25
    assert make_engine(overhead_s=ovh, speedup=0.25).frontend_exit(0.0, 10) == pytest.approx(0.04 + 0.009)
    assert make_engine(overhead_s=ovh, speedup=100.0).frontend_exit(0.0, 10) == 0.0  # never negative


def test_bad_sampling_sections_are_refused(sim_profile: Profile) -> None:
    with pytest.raises(ProfileError, match="sampling_s"):
        load_profile(sim_profile(sampling_s={"random": 0.001, "top_p": 0.1}))
    with pytest.raises(ProfileError, match=r"sampling_s\.random"):
        load_profile(sim_profile(sampling_s={"random": -1}))
    p = load_profile(sim_profile(sampling_s={"random": 0.001}))
    assert p.sampling is not None and p.sampling.cpu_base is None and p.sampling.min_tokens == 0.0


def test_shipped_profiles_carry_no_sampling_cost_until_the_probes_tell_it_from_zero() -> None:
    """A sampling cost is applied only where the probes' extra step time is over 2 standard errors; the
    committed boots (docs/results/real-h200/probes/colocate-h200-s3.json: each worker's decode greedy and with the
    bench's sampling) disagree (+0.34 ms and -0.07 ms on the small models: their speed drifts within a boot),
    so no shipped profile has ``sampling_s``."""
    for name in ("h200-qwen2.5-0.5b", "h200-qwen2.5-1.5b", "h200-qwen2.5-7b", "h200-qwen2.5-14b"):
        assert load_profile(name).sampling is None, name


# -- over the wire ------------------------------------------------------------------------------------
def tpot(srv: ServerThread, out: int = 30, **body: object) -> float:
    with openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=30) as client:
        t0 = time.perf_counter()
        first, n = -1.0, 0
        extra = {"ignore_eos": True, **body}
        stream = client.completions.create(
            model="sim-test", prompt="one two three", max_tokens=out, stream=True, extra_body=extra
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                n += 1
                if first < 0:
                    first = time.perf_counter() - t0
        return (time.perf_counter() - t0 - first) / (n - 1)


def test_sampled_decode_is_slower_than_greedy_as_modelled(sim_server: SimServer, sim_profile: Profile) -> None:
    # a 4.1 ms step, 8 ms more for random sampling; speedup 2: greedy ~2 ms a token, sampled ~6 ms
    srv = sim_server(profile=sim_profile(sampling_s={"random": 0.008}), speedup=2.0)
    greedy = tpot(srv, temperature=0)
    default = tpot(srv)  # no temperature: vLLM's 1.0
    hot = tpot(srv, temperature=0.7, top_p=0.9)
    assert 0.0015 < greedy < 0.0035
    for sampled in (default, hot):
        assert sampled - greedy == pytest.approx(0.004, abs=0.0015)


def test_an_old_profile_times_greedy_and_sampled_alike(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile(step_time_s={"base": 0.01}), speedup=2.0)
    greedy, sampled = tpot(srv, temperature=0), tpot(srv, temperature=1.0, min_tokens=30)
    assert sampled == pytest.approx(greedy, rel=0.3)  # 5 ms both (+ the box's noise)


def test_a_negative_temperature_is_refused(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile())
    for bad in (-0.5, "hot"):
        r = httpx.post(f"{srv.url}/v1/completions", json={"model": "sim-test", "prompt": "a b", "temperature": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
