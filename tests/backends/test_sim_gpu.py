"""Simulated workers that share one GPU (backends/sim/gpu.py): one clock, the GPU handed round in time slices."""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from backends.sim.engine import Engine, Request
from backends.sim.gpu import SharedGPU
from backends.sim.server import SimSettings, create_shared_gpu_app
from backends.sim.textgen import Answer
from predictor.prior import WorkerProfile
from predictor.sharing import decode_step, stretched, turn_wait
from router.core.profile import GPU_SWITCH_S as SWITCH_S
from router.core.profile import GPU_TIMESLICE_S as TIMESLICE_S
from router.core.profile import load_profile
from router.core.types import BackendView
from router.serve import sim_command, sim_groups
from tests.conftest import make_config

Profile = Callable[..., str]


def _req(tag: int, out: int, prompt: int = 4) -> Request:
    return Request(f"r{tag}", list(range(tag * 1000, tag * 1000 + prompt)), Answer(out, word_start=tag, marker=None),
                   max_tokens=out)  # fmt: skip


async def _finished(r: Request) -> None:
    while not r.done:
        await r.wait_for_output(len(r.output))


def _itl(engine: Engine) -> float:
    return engine.stats.itl.sum / engine.stats.itl.count


def _virtual(gpu: SharedGPU, arrivals: list[tuple[float, Engine, Request]], until: float = 10.0) -> None:
    """Drive ``gpu`` on a virtual clock (no sleeping): requests reach their engine's queue at the given
    times; every step ends exactly on schedule."""
    pending = sorted(arrivals, key=lambda a: a[0])
    t = 0.0
    while t < until:
        while pending and pending[0][0] <= t:
            _, e, r = pending.pop(0)
            e.enqueue(r, t)
        gpu.start(t)
        nxt = min(gpu.next_event(), pending[0][0] if pending else float("inf"))
        if nxt == float("inf"):
            return
        t = nxt
        for e in gpu.advance(t):
            e.commit(gpu.pop(e), t)


def _busy(engines: list[Engine], outs: list[int], **gpu: float) -> None:
    """One request of ``outs[i]`` tokens on engine i, all from t = 0, on one virtual-clock SharedGPU."""
    _virtual(
        SharedGPU(engines, **gpu),
        [(0.0, e, _req(i, out)) for i, (e, out) in enumerate(zip(engines, outs, strict=True))],
    )


def test_small_workers_whose_steps_fit_a_slice_lock_step(make_engine: Callable[..., Engine]) -> None:
    # steps of 4 ms and 2 ms, all GPU work, both shorter than the 5 ms slice: whole steps in turn, so
    # both see the same inter-token time, the sum of the steps (plus a switch cost per turn)
    a, b = (
        make_engine(step_time_s={"base": 0.004, "decode_seqs": 0.0}),
        make_engine(step_time_s={"base": 0.002, "decode_seqs": 0.0}),
    )
    _busy([a, b], [60, 60], timeslice=0.005, switch=0.0005)
    assert _itl(a) == pytest.approx(0.007, rel=0.05)
    assert _itl(b) == pytest.approx(0.007, rel=0.05)


def test_a_long_step_waits_for_the_neighbours_turn_after_each_slice(make_engine: Callable[..., Engine]) -> None:
    # the 9 ms step needs three 3 ms turns, and the 2 ms neighbour takes a turn between each: the big
    # one slows to 9 + 3 x 2 = 15 ms (~1.7x), the small one to 2 + 3 = 5 ms (2.5x): not in proportion
    def run(small_out: int, big_out: int) -> tuple[float, float]:  # (the one that ends first is all shared)
        small = make_engine(step_time_s={"base": 0.002, "decode_seqs": 0.0})
        big = make_engine(step_time_s={"base": 0.009, "decode_seqs": 0.0})
        _busy([small, big], [small_out, big_out], timeslice=0.003, switch=0.0)
        return _itl(small), _itl(big)

    assert run(150, 60)[0] == pytest.approx(0.005, rel=0.03)
    assert run(300, 40)[1] == pytest.approx(0.015, rel=0.03)


def test_a_long_step_next_to_two_busy_small_ones_slows_about_threefold(make_engine: Callable[..., Engine]) -> None:
    # the H200's shape: two small workers whose GPU work fits a slice, a 4.5 ms step needing three
    small = [make_engine(step_time_s={"base": 0.002, "decode_seqs": 0.0}, gpu_share=0.5) for _ in range(2)]
    big = make_engine(step_time_s={"base": 0.0045, "decode_seqs": 0.0})
    _busy([*small, big], [300, 300, 60], timeslice=0.0016, switch=0.0)
    assert _itl(big) / 0.0045 == pytest.approx(1 + 3 * 2 * 0.001 / 0.0045, rel=0.08)  # 4.5 + 3 x (1 + 1) = 10.5 ms
    assert _itl(small[0]) == pytest.approx(_itl(small[1]), rel=0.02)  # lock-stepped


def test_the_cpu_part_of_a_step_is_not_shared(make_engine: Callable[..., Engine]) -> None:
    # half of each 4 ms step is CPU work: while one engine's CPU part runs, the other's GPU part does;
    # the two interleave without slowing each other down
    a, b = (make_engine(step_time_s={"base": 0.004, "decode_seqs": 0.0}, gpu_share=0.5) for _ in range(2))
    _busy([a, b], [50, 50], timeslice=0.005, switch=0.0)
    assert _itl(a) == pytest.approx(0.004, rel=0.05)
    assert _itl(b) == pytest.approx(0.004, rel=0.05)


def test_an_idle_neighbour_costs_nothing(make_engine: Callable[..., Engine]) -> None:
    busy, idle = make_engine(step_time_s={"base": 0.005}), make_engine(step_time_s={"base": 0.005})
    gpu = SharedGPU([busy, idle], timeslice=0.001, switch=0.001)
    _virtual(gpu, [(0.0, busy, _req(1, 30)), (0.0, busy, _req(2, 30))])
    assert _itl(busy) == pytest.approx(0.0052, rel=0.01)  # base + decode_seqs x 2: not cut into slices
    assert idle.stats.steps == 0


def test_a_neighbour_that_queues_ends_a_lone_turn_at_the_next_slice(make_engine: Callable[..., Engine]) -> None:
    a = make_engine(step_time_s={"base": 0.02, "decode_seqs": 0.0})
    b = make_engine(step_time_s={"base": 0.002, "decode_seqs": 0.0})
    ra, rb = _req(1, 1), _req(2, 1)
    _virtual(SharedGPU([a, b], timeslice=0.004, switch=0.0), [(0.0, a, ra), (0.005, b, rb)])
    # (each first step is a prefill of 4 tokens: 0.08 ms more)
    assert rb.first_token == pytest.approx(0.010, abs=2e-4)  # a's turn runs to the 8 ms boundary, then b's step
    assert ra.first_token == pytest.approx(0.022, abs=3e-4)  # a's 20 ms of work, plus b's 2 ms


def test_launch_bound_eager_steps_do_not_share_the_gpu(make_engine: Callable[..., Engine]) -> None:
    # a's prefill of 100 tokens runs eager (over 8 tokens): 30 ms, of which the linear model's
    # 4 + 2 = 6 ms is GPU work, after 24 ms of launches; b decodes 10 ms steps all along.
    eager = {"max_tokens": 8, "eager_floor_s": 0.03}
    a, b = make_engine(cudagraph=eager), make_engine(step_time_s={"base": 0.01, "decode_seqs": 0.0})
    ra, rb = _req(1, 1, prompt=100), _req(2, 20)
    _virtual(SharedGPU([a, b], timeslice=0.02, switch=0.0), [(0.0, b, rb), (0.0, a, ra)])
    # at 24 ms a queues behind b's step (20-30 ms) and then runs its 6 ms: first token at 36 ms
    assert ra.first_token == pytest.approx(0.036, abs=2e-4)  # (b's first step, a prefill, is 0.08 ms longer)
    assert _itl(b) < 0.0125


def test_the_clocked_loop_runs_the_model(make_engine: Callable[..., Engine]) -> None:
    # the same lock-step as above, on the event loop's clock with a neighbour joining late
    a, b = (
        make_engine(step_time_s={"base": 0.004, "decode_seqs": 0.0}),
        make_engine(step_time_s={"base": 0.006, "decode_seqs": 0.0}),
    )
    ra, rb = _req(1, 40), _req(2, 30)

    async def main() -> None:
        task = asyncio.create_task(SharedGPU([a, b], timeslice=0.01, switch=0.0).run())
        a.submit(ra)
        await asyncio.sleep(0.02)
        b.submit(rb)
        await _finished(rb)
        task.cancel()

    asyncio.run(main())
    assert _itl(b) == pytest.approx(0.010, rel=0.2)
    assert a.stats.lag.count > 0


# -- over the wire: one process, two ports, one GPU -----------------------------------------------
@contextmanager
def shared_gpu_servers(*settings: SimSettings) -> Iterator[list[str]]:
    socks = []
    for _ in settings:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [int(s.getsockname()[1]) for s in socks]
    app = create_shared_gpu_app(list(zip(settings, ports, strict=True)))
    config = uvicorn.Config(app, lifespan="on", log_level="error", log_config=None, ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": socks}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    try:
        yield [f"http://127.0.0.1:{p}" for p in ports]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        for s in socks:
            s.close()


def _tpot(url: str, model: str, out: int = 40) -> float:
    body = {"model": model, "prompt": f"hello {url}", "max_tokens": out, "stream": True,
            "sim": {"output_tokens": out}}  # fmt: skip
    stamps = []
    with httpx.Client(timeout=30) as client, client.stream("POST", url + "/v1/completions", json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def test_two_workers_on_one_gpu_over_http(sim_profile: Profile) -> None:
    # 10 ms steps of GPU work, longer than the default slice: taken in turns, each with a switch cost
    prof = sim_profile(step_time_s={"base": 0.01, "decode_seqs": 0.0})
    a, b = SimSettings(profile=prof, seed=1), SimSettings(profile=prof, model="other", seed=2)
    with shared_gpu_servers(a, b) as (url_a, url_b):
        assert httpx.get(url_b + "/v1/models").json()["data"][0]["id"] == "other"
        alone = _tpot(url_a, "sim-test")
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(_tpot, [url_a, url_b], ["sim-test", "other"]))
        metrics_b = httpx.get(url_b + "/metrics").text
    assert alone == pytest.approx(0.010, rel=0.3)
    turns = math.ceil(0.010 / TIMESLICE_S)
    expected = 2 * 0.010 + 2 * turns * SWITCH_S
    assert both[0] == pytest.approx(expected, rel=0.3) and both[1] == pytest.approx(expected, rel=0.3)
    assert 'model_name="other"' in metrics_b


def test_serve_groups_sim_backends_by_gpu() -> None:
    def backend(name: str, port: int, gpu: int | None) -> dict[str, object]:
        b: dict[str, object] = {"name": name, "url": f"http://127.0.0.1:{port}", "model": name,
                                "sim": {"profile": "h200-qwen2.5-0.5b", "seed": port}}  # fmt: skip
        if gpu is not None:
            b["gpu"] = gpu
        return b

    cfg = make_config([backend("a", 9001, 0), backend("b", 9002, 1), backend("c", 9003, 0), backend("d", 9004, None),
                       {"name": "real", "url": "http://127.0.0.1:9005", "model": "real", "gpu": 0}])  # fmt: skip
    groups = [[b.name for b in g] for g in sim_groups(cfg.backends)]
    assert groups == [["a", "c"], ["b"], ["d"]]
    cmd = sim_command(*sim_groups(cfg.backends)[0])
    assert cmd[cmd.index("--port") + 1] == "9001"
    also = cmd[cmd.index("--also") + 1]
    assert "port=9003" in also and "model=c" in also and "seed=9003" in also and "kv_tokens=100000" in also
    assert "--also" not in sim_command(*sim_groups(cfg.backends)[1])


def timeslice_periods(cpu: dict[str, float], gpu: dict[str, float], q: float, switch: float,
                      horizon: float = 600.0) -> dict[str, float]:  # fmt: skip
    """A reference for :class:`SharedGPU`, written apart from it: the mean step period (ms) of each worker
    decoding back to back on one time-sliced GPU, as a closed loop. A step is ``cpu[m]`` of CPU work (its own,
    not shared), then ``gpu[m]`` of GPU work; contexts with GPU work take turns in round-robin order; a turn
    lasts ``min(remaining, q)``; handing the GPU to another context first costs ``switch``; a context whose
    turn ends with work left goes to the back of the queue."""
    names = list(cpu)
    cpu_end: dict[str, float | None] = {m: cpu[m] * k / len(names) for k, m in enumerate(names)}  # staggered
    rem = dict.fromkeys(names, 0.0)
    queue: list[str] = []
    done: dict[str, list[float]] = {m: [] for m in names}
    cur: str | None = None
    last: str | None = None
    t = turn_end = 0.0
    while t < horizon:
        ready = [(v, m) for m, v in cpu_end.items() if v is not None]
        first = min(ready) if ready else (float("inf"), "")
        if cur is not None and turn_end <= first[0]:
            t, m = turn_end, cur
            cur = None
            if rem[m] <= 1e-12:
                done[m].append(t)
                cpu_end[m] = t + cpu[m]
            else:
                queue.append(m)
        else:
            t, m = first
            cpu_end[m] = None
            rem[m] = gpu[m]
            queue.append(m)
        if cur is None and queue:
            cur = queue.pop(0)
            run = min(rem[cur], q)
            rem[cur] -= run
            turn_end = t + (switch if last not in (None, cur) else 0.0) + run
            last = cur
    out = {}
    for m, ts in done.items():
        ts = [x for x in ts if x > 0.25 * horizon]
        out[m] = (ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 1 else float("nan")
    return out


def test_the_sim_time_slices_as_the_reference_model(make_engine: Callable[..., Engine]) -> None:
    steps = {"a": (0.0014, 0.0006), "b": (0.001, 0.0016), "c": (0.0003, 0.0043)}  # (CPU, GPU) seconds
    engines = {m: make_engine(step_time_s={"base": c + g, "decode_seqs": 0.0}, gpu_share=g / (c + g))
               for m, (c, g) in steps.items()}  # fmt: skip
    gpu = SharedGPU(list(engines.values()), timeslice=0.00144, switch=0.0005)
    _virtual(gpu, [(0.0, e, _req(i, 10_000)) for i, e in enumerate(engines.values())], until=1.0)  # all busy
    model = timeslice_periods({m: 1e3 * c for m, (c, _) in steps.items()},
                              {m: 1e3 * g for m, (_, g) in steps.items()}, 1.44, 0.5)  # fmt: skip
    for m, e in engines.items():
        assert _itl(e) * 1e3 == pytest.approx(model[m], rel=0.03)


def test_the_router_prices_sharing_as_the_sim_runs_it() -> None:
    # the shipped H200 profiles, all three busy at batch 8 for the whole window: the sim's inter-token times and
    # the predictive policy's stretched steps (predictor/sharing.py) agree; the small ones lock-step
    names = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b")
    profiles = [load_profile(f"h200-{m}") for m in names]
    engines = [Engine(p, kv_tokens=p.kv_budget_tokens, max_num_seqs=p.max_num_seqs,
                      max_num_batched_tokens=p.max_num_batched_tokens) for p in profiles]  # fmt: skip
    _virtual(SharedGPU(engines), [(0.0, e, _req(i * 10 + k, 100_000)) for i, e in enumerate(engines) for k in range(8)],
             until=3.0)  # fmt: skip
    wps = [WorkerProfile.of(p) for p in profiles]
    view = BackendView(name="w", model="m", inflight_requests=8, inflight_tokens=8 * 400)
    steps = [decode_step(wp, view) for wp in wps]
    for i, (wp, e) in enumerate(zip(wps, engines, strict=True)):
        wait = turn_wait([wps[j].gpu_share * steps[j] for j in range(3) if j != i], TIMESLICE_S, SWITCH_S)
        assert _itl(e) == pytest.approx(stretched(steps[i], wp.gpu_share, wait, TIMESLICE_S), rel=0.1), names[i]
