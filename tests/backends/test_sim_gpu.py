"""Simulated workers that share one GPU (backends/sim/gpu.py): one clock, time divided among steps."""

from __future__ import annotations

import asyncio
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
from router.serve import sim_command, sim_groups
from tests.conftest import make_config

Profile = Callable[..., str]


def _req(tag: int, out: int) -> Request:
    return Request(f"r{tag}", [1, 2, 3, 4], Answer(out, word_start=tag, marker=None), max_tokens=out)


async def _finished(r: Request) -> None:
    while not r.done:
        await r.wait_for_output(len(r.output))


def _itl(engine: Engine) -> float:
    return engine.stats.itl.sum / engine.stats.itl.count


async def _decode(engines: list[Engine], loads: list[int], outs: list[int]) -> None:
    """Run ``loads[i]`` requests of ``outs[i]`` tokens on engine i, all on one SharedGPU, to the end."""
    task = asyncio.create_task(SharedGPU(engines).run())
    reqs = []
    for i, (e, n, out) in enumerate(zip(engines, loads, outs, strict=True)):
        for k in range(n):
            r = _req(100 * i + k, out)
            reqs.append(r)
            e.submit(r)
    for r in reqs:
        await _finished(r)
    task.cancel()


def test_busy_engines_share_the_gpu_in_proportion_to_their_steps(make_engine: Callable[..., Engine]) -> None:
    # decode-bound: a step lasts `base` (4 ms and 12 ms). Both busy the whole time (90 tokens of
    # 8 ms ≈ 30 of 24 ms), the GPU's time is split in two, so each step takes twice as long.
    small, big = make_engine(step_time_s={"base": 0.004}), make_engine(step_time_s={"base": 0.012})
    asyncio.run(_decode([small, big], [1, 1], [90, 30]))
    assert _itl(small) == pytest.approx(0.008, rel=0.15)
    assert _itl(big) == pytest.approx(0.024, rel=0.15)


def test_an_idle_neighbour_costs_nothing(make_engine: Callable[..., Engine]) -> None:
    busy, idle = make_engine(step_time_s={"base": 0.005}), make_engine(step_time_s={"base": 0.005})
    asyncio.run(_decode([busy, idle], [2, 0], [30, 30]))
    assert _itl(busy) == pytest.approx(0.005, rel=0.15)
    assert idle.stats.steps == 0


def test_a_neighbour_that_joins_mid_step_slows_the_rest_of_it(make_engine: Callable[..., Engine]) -> None:
    a, b = make_engine(step_time_s={"base": 0.02}), make_engine(step_time_s={"base": 0.02})
    ra, rb = _req(1, 10), _req(2, 10)

    async def main() -> None:
        task = asyncio.create_task(SharedGPU([a, b]).run())
        a.submit(ra)
        await asyncio.sleep(0.01)  # half-way through a's first step
        b.submit(rb)
        await _finished(ra)
        await _finished(rb)
        task.cancel()

    asyncio.run(main())
    # a: 10 ms alone + 10 ms of GPU at half speed = 30 ms for its first step; both then alternate 40 ms
    assert ra.first_token - ra.queued_at == pytest.approx(0.03, abs=0.006)
    assert _itl(a) == pytest.approx(0.04, rel=0.15)


def test_launch_bound_eager_steps_do_not_share_the_gpu(make_engine: Callable[..., Engine]) -> None:
    # a's prefill of 100 tokens runs eager (over 8 tokens): 30 ms, of which the linear model's
    # 4 + 2 = 6 ms is GPU work; b decodes all along (10 ms steps). Only those 6 ms are shared.
    eager = {"max_tokens": 8, "eager_floor_s": 0.03}
    a, b = make_engine(cudagraph=eager), make_engine(step_time_s={"base": 0.01})
    ra = Request("a", list(range(100)), Answer(1, word_start=0, marker=None), max_tokens=1)
    rb = _req(2, 20)

    async def main() -> None:
        task = asyncio.create_task(SharedGPU([a, b]).run())
        b.submit(rb)
        a.submit(ra)
        await _finished(ra)
        await _finished(rb)
        task.cancel()

    asyncio.run(main())
    assert ra.first_token - ra.queued_at == pytest.approx(0.036, abs=0.006)  # 24 ms alone + 6 ms at half speed
    assert _itl(b) < 0.012


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
    prof = sim_profile(step_time_s={"base": 0.01, "decode_seqs": 0.0})
    a, b = SimSettings(profile=prof, seed=1), SimSettings(profile=prof, model="other", seed=2)
    with shared_gpu_servers(a, b) as (url_a, url_b):
        assert httpx.get(url_b + "/v1/models").json()["data"][0]["id"] == "other"
        alone = _tpot(url_a, "sim-test")
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(_tpot, [url_a, url_b], ["sim-test", "other"]))
        metrics_b = httpx.get(url_b + "/metrics").text
    assert alone == pytest.approx(0.010, rel=0.3)
    assert both[0] == pytest.approx(0.020, rel=0.3) and both[1] == pytest.approx(0.020, rel=0.3)
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
