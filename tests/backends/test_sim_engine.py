"""The scheduler and its clock, stepped synchronously (no HTTP, no event loop)."""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest

from backends.sim.engine import Batch, Engine, Request, Status
from backends.sim.server import SimSettings, build_engine
from backends.sim.textgen import Answer
from router.core.errors import ProfileError
from router.core.profile import PROFILE_DIR, STREAM_RHO_MAX

MakeEngine = Callable[..., Engine]


def request(prompt: list[int] | int, out: int, tag: int = 0, arrival: float = 0.0) -> Request:
    ids = prompt if isinstance(prompt, list) else [tag * 1_000_000 + i for i in range(prompt)]
    return Request(f"r{tag}", ids, Answer(out, word_start=tag, marker=None), max_tokens=out, arrival=arrival)


def run(engine: Engine, t: float = 0.0, max_steps: int = 100_000) -> list[Batch]:
    batches = []
    while not engine.idle and len(batches) < max_steps:
        batch = engine.step(t)
        batches.append(batch)
        t += batch.duration
    return batches


def test_decode_runs_one_token_per_step_and_finishes(make_engine: MakeEngine) -> None:
    engine = make_engine()
    r = request(20, out=5)
    engine.enqueue(r)
    batches = run(engine)
    assert [b.num_new for b in batches] == [[20], [1], [1], [1], [1]]
    assert r.status is Status.FINISHED and len(r.output) == 5
    assert engine.kv.usage == 0.0
    assert engine.stats.generation_tokens == 5 and engine.stats.prompt_tokens == 20


def test_step_time_is_the_profiles_linear_model(make_engine: MakeEngine) -> None:
    engine = make_engine(speedup=2.0, step_time_s={"decode_context_tokens": 1e-6, "prefill_attn_mtok2": 0.5})
    c = engine.profile.step_time
    engine.enqueue(request(100, out=3))
    first = engine.step(0.0)
    attn = 100 * (0 + 100 / 2) / 1e6
    assert abs(first.duration - (c.base + 100 * c.prefill_tokens + attn * c.prefill_attn_mtok2) / 2) < 1e-12
    second = engine.step(first.duration)
    expected = (c.base + c.decode_seqs + 101 * c.decode_context_tokens) / 2
    assert abs(second.duration - expected) < 1e-12


def test_long_prompts_are_chunked_under_the_token_budget(make_engine: MakeEngine) -> None:
    engine = make_engine(max_num_batched_tokens=512)
    engine.enqueue(request(1200, out=2, tag=1))
    engine.enqueue(request(100, out=2, tag=2))
    batches = run(engine)
    assert batches[0].num_new == [512]
    assert batches[1].num_new == [512]
    assert batches[2].num_new == [176, 100]  # the tail chunk and the next request share a step
    assert all(sum(b.num_new) <= 512 for b in batches)


def test_max_num_seqs_caps_the_batch(make_engine: MakeEngine) -> None:
    engine = make_engine(max_num_seqs=3)
    for k in range(5):
        engine.enqueue(request(10, out=4, tag=k))
    engine.step(0.0)
    assert len(engine.running) == 3 and len(engine.waiting) == 2


def test_requests_queue_when_the_kv_budget_is_exhausted(make_engine: MakeEngine) -> None:
    engine = make_engine(kv_budget_tokens=16 * 10)
    for k in range(4):
        engine.enqueue(request(60, out=8, tag=k))  # 4 blocks each with its first tokens
    engine.step(0.0)
    assert len(engine.running) == 2 and len(engine.waiting) == 2
    run(engine)
    assert engine.stats.finished == 4


def test_preemption_evicts_the_newest_running_request(make_engine: MakeEngine) -> None:
    engine = make_engine(kv_budget_tokens=16 * 8)
    old, young = request(60, out=40, tag=1), request(60, out=40, tag=2)
    engine.enqueue(old)
    engine.enqueue(young)
    t = 0.0
    while engine.stats.preemptions == 0:
        t += engine.step(t).duration
    assert young.status is Status.WAITING and young.num_computed == 0 and young.block_ids == []
    assert engine.waiting[0] is young
    assert old.status is Status.RUNNING
    run(engine, t)
    assert old.status is young.status is Status.FINISHED
    assert len(old.output) == len(young.output) == 40


def test_ttft_grows_with_prompt_length(make_engine: MakeEngine) -> None:
    ttfts = []
    for n in (50, 2000, 6000):
        engine = make_engine()
        r = request(n, out=2)
        engine.enqueue(r)
        run(engine)
        ttfts.append(r.first_token - r.arrival)
    assert ttfts[0] < ttfts[1] < ttfts[2]


def test_time_per_output_token_grows_with_batch_size(make_engine: MakeEngine) -> None:
    tpots = []
    for batch in (1, 16, 64):
        engine = make_engine()
        reqs = [request(10, out=50, tag=k) for k in range(batch)]
        for r in reqs:
            engine.enqueue(r)
        run(engine)
        tpots.append(max((r.finished_at - r.first_token) / 49 for r in reqs))
    assert tpots[0] < tpots[1] < tpots[2]


def test_prefix_cache_skips_the_cached_prompt(make_engine: MakeEngine) -> None:
    engine = make_engine()
    prompt = list(range(1000))
    first = request(prompt, out=2, tag=1)
    engine.enqueue(first)
    run(engine)
    second = request([*prompt, 7, 8], out=2, tag=2, arrival=10.0)
    engine.enqueue(second)
    batch = engine.step(10.0)
    assert batch.num_new == [1002 - 992]  # 62 full blocks hit
    assert engine.stats.prefix_hits == 992
    assert engine.stats.prefix_queries == 1000 + 1002
    run(engine, 10.0 + batch.duration)
    assert second.first_token - second.arrival < (first.first_token - first.arrival) / 5


def test_abort_frees_blocks_and_leaves_the_rest_running(make_engine: MakeEngine) -> None:
    engine = make_engine()
    a, b = request(100, out=50, tag=1), request(100, out=50, tag=2)
    engine.enqueue(a)
    engine.enqueue(b)
    engine.step(0.0)
    used = engine.kv.usage
    engine.abort(a)
    assert a.status is Status.ABORTED and engine.running == [b]
    assert engine.kv.usage < used
    run(engine, 1.0)
    assert b.status is Status.FINISHED and engine.kv.usage == 0.0


CLIFF = {"max_tokens": 128, "eager_floor_s": 0.02, "eager_extra_s": 0.001, "eager_per_token_s": 1e-6}


def test_a_step_above_the_cudagraph_limit_costs_the_eager_terms(make_engine: MakeEngine) -> None:
    engine = make_engine(cudagraph=CLIFF)
    c = engine.profile.step_time
    engine.enqueue(request(128, out=2, tag=1))
    graph = engine.step(0.0)  # 128 tokens: inside the CUDA graphs, the linear model alone
    assert abs(graph.duration - (c.base + 128 * c.prefill_tokens)) < 1e-12
    engine = make_engine(cudagraph=CLIFF)
    engine.enqueue(request(129, out=2, tag=2))
    eager = engine.step(0.0)  # 129 tokens: max(linear, floor) + extra + per token
    assert abs(eager.duration - (0.02 + 0.001 + 129 * 1e-6)) < 1e-12
    assert eager.duration > 2 * graph.duration
    engine = make_engine(cudagraph=CLIFF)
    engine.enqueue(request(2000, out=2, tag=3))
    big = engine.step(0.0)  # GPU-bound: the linear model is above the floor
    assert abs(big.duration - (c.base + 2000 * c.prefill_tokens + 0.001 + 2000 * 1e-6)) < 1e-12


def test_a_prefill_only_step_skips_the_eager_extra_when_the_profile_says_so(make_engine: MakeEngine) -> None:
    """``eager_extra_decode_only``: a lone prompt's eager step pays max(linear, floor) + per token only; a step that
    also decodes pays the extra (the H200's lone TTFTs hold no such cost, its eager decode and mixed steps do)."""
    cliff = dict(CLIFF, eager_extra_decode_only=True)
    engine = make_engine(cudagraph=cliff)
    engine.enqueue(request(129, out=3, tag=1))
    alone = engine.step(0.0)
    assert abs(alone.duration - (0.02 + 129 * 1e-6)) < 1e-12
    engine.enqueue(request(200, out=3, tag=2))
    mixed = engine.step(1.0)  # the first request decodes while the second prefills: 201 tokens, eager
    assert abs(mixed.duration - (0.02 + 0.001 + 201 * 1e-6)) < 1e-12
    engine = make_engine(cudagraph=CLIFF)  # without the flag every eager step pays it (profiles before 2026-12)
    engine.enqueue(request(129, out=3, tag=3))
    assert abs(engine.step(0.0).duration - (0.02 + 0.001 + 129 * 1e-6)) < 1e-12


def test_decode_batches_above_the_limit_fall_off_the_cliff(make_engine: MakeEngine) -> None:
    def step_of(n: int) -> float:
        engine = make_engine(cudagraph=CLIFF, max_num_seqs=512)
        reqs = [request(4, out=3, tag=k) for k in range(n)]
        for r in reqs:
            engine.enqueue(r)
        engine.step(0.0)  # prefill (n * 4 tokens)
        return engine.step(1.0).duration  # one decode step of n sequences

    c = make_engine().profile.step_time
    assert abs(step_of(128) - (c.base + 128 * c.decode_seqs)) < 1e-12
    linear = c.base + 129 * c.decode_seqs
    assert abs(step_of(129) - (max(linear, 0.02) + 0.001 + 129 * 1e-6)) < 1e-12
    assert step_of(129) - step_of(128) > 0.004  # a cliff, not the 0.1 ms of one more sequence


def test_streamed_tokens_slow_the_front_end_down_as_a_queue_would(make_engine: MakeEngine) -> None:
    """frontend_s.stream_token / stream_wait: with B requests streaming tokens, a new request's way through the
    API server takes stream_wait * rho / (1 - rho) longer, rho = streamed tokens per second * stream_token;
    requests that do not stream cost nothing, and an idle engine none."""

    def delay(batch: int, stream: bool, speedup: float = 1.0) -> float:
        engine = make_engine(
            speedup=speedup,
            frontend_s={"stream_token": 1e-4, "stream_wait": 0.01},
            step_time_s={"base": 0.004, "decode_seqs": 0.0},  # 4 ms steps whatever the batch
            overhead_s={"ttft": 0.0},
        )
        for k in range(batch):
            r = request(16, out=500, tag=k)
            r.notify_each = stream
            engine.enqueue(r, 0.0)
        t = 0.0
        for _ in range(60):  # long enough for the smoothed rate to settle
            t += engine.step(t).duration
        return (engine.frontend_exit(t, 0) - t) * speedup  # modelled seconds

    assert delay(0, True) == 0.0
    assert delay(8, False) == 0.0
    for batch in (4, 8, 16):
        rho = batch / 0.004 * 1e-4  # 0.1, 0.2, 0.4
        assert delay(batch, True) == pytest.approx(0.01 * rho / (1 - rho), rel=1e-3)
    assert delay(8, True, speedup=0.25) == pytest.approx(delay(8, True), rel=1e-3)  # modelled time at any speed
    assert delay(64, True) == pytest.approx(0.01 * STREAM_RHO_MAX / (1 - STREAM_RHO_MAX), rel=1e-3)  # capped


def test_the_serial_front_end_spreads_a_burst(make_engine: MakeEngine) -> None:
    engine = make_engine(frontend_s={"per_request": 0.002, "per_prompt_token": 1e-5}, overhead_s={"ttft": 0.01})
    exits = [engine.frontend_exit(0.0, 100) for _ in range(4)]  # a burst of 4: one after another
    assert [round(x, 9) for x in exits] == [0.013, 0.016, 0.019, 0.022]
    assert abs(engine.frontend_exit(1.0, 0) - 1.012) < 1e-12  # idle again: no wait
    plain = make_engine(overhead_s={"ttft": 0.01})  # no frontend_s: the old constant overhead
    assert [plain.frontend_exit(0.0, 100) for _ in range(3)] == [0.01, 0.01, 0.01]


def test_ttft_jitter_spreads_the_constant_evenly_around_it(make_engine: MakeEngine) -> None:
    """overhead_s.ttft_jitter: each request's constant is drawn from ttft ± jitter/2 (seeded, in submission
    order), so real vLLM's request-to-request spread is there and the median stays put."""
    jittery = make_engine(overhead_s={"ttft": 0.01, "ttft_jitter": 0.016})
    exits = [jittery.frontend_exit(0.0, 100) for _ in range(2000)]
    assert min(exits) >= 0.002 and max(exits) <= 0.018
    assert abs(statistics.median(exits) - 0.01) < 0.001
    assert max(exits) - min(exits) > 0.015  # the whole width is used
    q = statistics.quantiles(exits, n=10)
    assert abs(q[0] - 0.0036) < 0.001 and abs(q[-1] - 0.0164) < 0.001  # even: p10 / p90 at ∓0.4 width
    again = make_engine(overhead_s={"ttft": 0.01, "ttft_jitter": 0.016})
    assert [again.frontend_exit(0.0, 100) for _ in range(2000)] == exits  # the same seed: the same draws
    other = make_engine(seed=1, overhead_s={"ttft": 0.01, "ttft_jitter": 0.016})
    assert [other.frontend_exit(0.0, 100) for _ in range(20)] != exits[:20]
    slow = make_engine(speedup=0.5, overhead_s={"ttft": 0.01, "ttft_jitter": 0.016})  # scales with speedup
    assert [slow.frontend_exit(0.0, 100) for _ in range(20)] == pytest.approx([2 * x for x in exits[:20]], rel=1e-12)
    # sim_http (wall time) does not shrink with a speedup > 1, so the constant can get narrower than the spread
    wide = {"ttft": 0.01, "sim_http": 0.006, "ttft_jitter": 0.016}
    make_engine(speedup=1.0, overhead_s=wide)  # at speedup 1: 10 ms ± 8 ms, fine
    with pytest.raises(ProfileError, match="ttft_jitter"):
        make_engine(speedup=2.0, overhead_s=wide)  # (10 + 6) / 2 - 6 = 2 ms ± 4 ms: refused, not clamped


def test_the_worker_seed_seeds_the_spread() -> None:
    def draws(seed: int) -> list[float]:
        settings = SimSettings(profile=_jittery_profile(), seed=seed)
        engine = build_engine(settings)[1]
        return [engine.frontend_exit(0.0, 10) for _ in range(10)]

    assert draws(1) == draws(1) != draws(2)


def test_the_serial_front_end_adds_queueing_to_a_burst_live(make_engine: MakeEngine) -> None:
    async def burst() -> list[float]:
        engine = make_engine(frontend_s={"per_request": 0.004})
        task = asyncio.create_task(engine.run())
        loop = asyncio.get_running_loop()
        t0 = loop.time()  # one arrival time: requests sharing an engine step must tie, not invert
        reqs = [request(8, out=1, tag=k, arrival=t0) for k in range(8)]
        for r in reqs:
            engine.submit(r)

        async def finish(r: Request) -> None:
            while not r.done:
                await r.wait_for_output(len(r.output))

        await asyncio.gather(*(finish(r) for r in reqs))
        task.cancel()
        return [r.first_token - r.arrival for r in reqs]

    ttft = asyncio.run(burst())
    assert ttft == sorted(ttft)  # FIFO: nobody overtakes in the front end
    assert ttft[-1] >= 8 * 0.004  # the last of the burst waited for the 7 before it


def test_async_scheduling_admits_a_request_that_came_mid_step_one_step_later(make_engine: MakeEngine) -> None:
    """vLLM's async scheduler schedules step N+1 while step N runs: a request that reaches a busy
    engine during step N is first scheduled in step N+2; a synchronous scheduler takes it in N+1."""
    for async_, first_step in ((False, 2), (True, 3)):
        engine = make_engine(async_scheduling=async_)
        decoder, late = request(20, out=10, tag=1), request(30, out=2, tag=2)
        engine.enqueue(decoder, 0.0)
        b0 = engine.step(0.0)  # step 0: the decoder's prefill
        b1 = engine.step(b0.duration)  # step 1: it decodes; the late request arrives during it
        engine.enqueue(late, b1.start + b1.duration / 2)
        t, steps = b1.start + b1.duration, [b0, b1]
        while late.first_scheduled < 0:
            steps.append(engine.step(t))
            t += steps[-1].duration
        assert late in steps[first_step].requests and late not in steps[first_step - 1].requests
        # vLLM stamps "scheduled" when it schedules the step: async, as the step before it started
        assert late.first_scheduled == steps[first_step - 1 if async_ else first_step].start
    # an idle engine takes a request at once, async or not
    engine = make_engine(async_scheduling=True)
    engine.enqueue(request(30, out=2, tag=3), 5.0)
    assert engine.step(5.0).num_new == [30]


def test_queue_and_prefill_times_split_a_requests_wait_from_its_prefill(make_engine: MakeEngine) -> None:
    """vllm:request_queue_time_seconds runs from the queue to the first scheduled step, and
    vllm:request_prefill_time_seconds from there to the first token, over every chunk of the prompt."""
    engine = make_engine(max_num_batched_tokens=512)
    first, second = request(1000, out=2, tag=1), request(100, out=2, tag=2)
    engine.enqueue(first, 0.0)
    engine.enqueue(second, 0.0)
    batches = run(engine)
    assert [b.num_new for b in batches[:2]] == [[512], [488, 24]]  # the second starts in the first's tail step
    ends = [b.start + b.duration for b in batches]
    q, pf = engine.stats.queue, engine.stats.prefill
    assert sum(q.counts) == sum(pf.counts) == 2
    assert abs(q.sum - batches[1].start) < 1e-12  # the first was scheduled at once, the second a step later
    assert abs(pf.sum - (ends[1] + (ends[2] - batches[1].start))) < 1e-12  # 2 chunks for one, 2 steps for the other


def test_a_schedule_behind_the_clock_still_admits_what_is_queued(make_engine: MakeEngine) -> None:
    # The clocked loop schedules at the planned end of the last step, which a late wake-up can put
    # before the queue time of a request that arrived meanwhile: it must still be taken (no stall).
    for async_ in (False, True):
        engine = make_engine(async_scheduling=async_)
        engine.enqueue(request(30, out=2, tag=4), 5.0)
        assert engine.step(4.9).num_new == [30]
        assert engine.stats.queue.sum == 0.0  # scheduled as it was queued, not 0.1 s before


def _jittery_profile() -> str:
    """The shipped 1.5B profile with a TTFT spread, written next to the tests' temporary files."""
    import tempfile

    raw = json.loads((PROFILE_DIR / "h200-qwen2.5-1.5b.json").read_text())
    raw["overhead_s"]["ttft_jitter"] = 0.01
    path = Path(tempfile.mkdtemp()) / "jittery.json"
    path.write_text(json.dumps(raw))
    return str(path)
