"""The prober against real loopback HTTP: a tiny uvicorn-served worker whose /health and /metrics
the test controls, and a port where nothing listens."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx2 as httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from backends.prober import Prober
from router.core.config import BackendConfig, HealthConfig
from router.core.types import BackendView
from router.state.memory import MemoryFleetState

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
"""

INTERVAL = 0.05
HEALTH = HealthConfig(probe_interval_s=INTERVAL, probe_timeout_s=0.2, eject_after_failures=3, readmit_after_successes=2)


@dataclass
class FakeWorker:
    url: str
    health_status: int = 200
    health_delay_s: float = 0.0
    metrics_status: int = 200
    metrics_text: str = METRICS
    health_hits: int = 0
    models: list[str] | None = field(default_factory=lambda: ["m"])  # /v1/models; None: 404
    models_auth: list[str | None] = field(default_factory=list)  # the Authorization each /v1/models call sent
    shutting_down: asyncio.Event = field(default_factory=asyncio.Event)


def _app(w: FakeWorker) -> Starlette:
    async def health(_: Request) -> Response:
        w.health_hits += 1
        if w.health_delay_s:
            # A stalled worker; it lets go at teardown so the server can shut down at once.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(w.shutting_down.wait(), w.health_delay_s)
        return Response(status_code=w.health_status)

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(w.metrics_text, status_code=w.metrics_status)

    async def models(request: Request) -> Response:
        w.models_auth.append(request.headers.get("authorization"))
        if w.models is None:
            return Response(status_code=404)
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model"} for m in w.models]})

    return Starlette(routes=[Route("/health", health), Route("/metrics", metrics), Route("/v1/models", models)])


def _free_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture
async def worker() -> AsyncIterator[FakeWorker]:
    sock = _free_socket()
    w = FakeWorker(url=f"http://127.0.0.1:{sock.getsockname()[1]}")
    config = uvicorn.Config(_app(w), log_level="warning", lifespan="off", ws="none", http="h11")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no started event
        await asyncio.sleep(0.005)
    yield w
    w.shutting_down.set()
    server.should_exit = True
    await task
    sock.close()


@pytest.fixture
def dead_url() -> str:
    sock = _free_socket()
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    return f"http://127.0.0.1:{port}"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as c:
        yield c


def _backend(name: str, url: str) -> BackendConfig:
    return BackendConfig(name=name, url=url, model="m", kv_budget_tokens=1000)


async def _until(pred: Callable[[], bool], within_s: float) -> float:
    """Seconds until ``pred()`` holds; fails the test after ``within_s``."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > within_s:
            raise AssertionError(f"condition not met within {within_s}s")
        await asyncio.sleep(0.005)
    return time.monotonic() - t0


def _prober(backends: list[BackendConfig], client: httpx.AsyncClient) -> tuple[Prober, MemoryFleetState]:
    state = MemoryFleetState(backends, HEALTH)
    return Prober(backends, state, client, HEALTH, rng=random.Random(0)), state


async def test_probe_once_healthy_with_metrics(worker: FakeWorker, client: httpx.AsyncClient) -> None:
    b = _backend("w", worker.url)
    prober, _ = _prober([b], client)
    ok, m = await prober.probe_once(b)
    assert ok and m is not None
    assert (m.running, m.waiting, m.kv_usage) == (3, 1, 0.42)


@pytest.mark.parametrize(("status", "text"), [(500, METRICS), (200, "<html>oops</html>"), (404, "")])
async def test_probe_once_healthy_but_metrics_unavailable(
    worker: FakeWorker, client: httpx.AsyncClient, status: int, text: str
) -> None:
    worker.metrics_status, worker.metrics_text = status, text
    b = _backend("w", worker.url)
    prober, _ = _prober([b], client)
    assert await prober.probe_once(b) == (True, None)


async def test_a_worker_serving_another_model_name_fails_its_probes(
    worker: FakeWorker, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Started with another --served-model-name, a worker would 404 every request routed to it."""
    b = _backend("w", worker.url)
    prober, _ = _prober([b], client)
    worker.models = ["Qwen/Qwen2.5-1.5B-Instruct"]
    assert await prober.probe_once(b) == (False, None)
    assert "not the configured model 'm'" in caplog.text
    worker.models = ["m", "m-lora"]  # fixed: healthy at the next probe
    ok, m = await prober.probe_once(b)
    assert ok and m is not None
    worker.models = ["other"]  # checked again only every MODEL_CHECK_S
    assert (await prober.probe_once(b))[0]
    monkeypatch.setattr("backends.prober.MODEL_CHECK_S", 0.0)
    assert not (await prober.probe_once(b))[0]
    worker.models = None  # no /v1/models at all (not vLLM): not held to it
    assert (await prober.probe_once(b))[0]
    assert set(worker.models_auth) == {None}
    keyed = BackendConfig(name="k", url=worker.url, model="m", kv_budget_tokens=1000, api_key="wk-1")
    await prober.probe_once(keyed)
    assert worker.models_auth[-1] == "Bearer wk-1"  # vLLM's --api-key guards /v1/*


async def test_probe_once_unhealthy_status(worker: FakeWorker, client: httpx.AsyncClient) -> None:
    worker.health_status = 503
    b = _backend("w", worker.url)
    prober, _ = _prober([b], client)
    assert await prober.probe_once(b) == (False, None)


async def test_probe_once_nothing_listening(dead_url: str, client: httpx.AsyncClient) -> None:
    b = _backend("w", dead_url)
    prober, _ = _prober([b], client)
    assert await prober.probe_once(b) == (False, None)


async def test_probe_once_is_bounded_by_the_timeout(worker: FakeWorker, client: httpx.AsyncClient) -> None:
    worker.health_delay_s = 5.0
    b = _backend("w", worker.url)
    prober, _ = _prober([b], client)
    t0 = time.monotonic()
    assert await prober.probe_once(b) == (False, None)
    assert time.monotonic() - t0 < HEALTH.probe_timeout_s + 0.3


async def test_ejection_and_readmission(worker: FakeWorker, client: httpx.AsyncClient) -> None:
    b = _backend("w", worker.url)
    prober, state = _prober([b], client)

    def view() -> BackendView:
        return state.snapshot().backends[0]

    await prober.start()
    try:
        await _until(lambda: view().running == 3, within_s=1.0)
        assert state.any_probe_ok() and view().kv_usage == 0.42 and view().healthy
        worker.health_status = 500
        # Eject within failures x interval (+ one interval of phase and some scheduling slack).
        took = await _until(lambda: not view().healthy, within_s=1.0)
        assert took < (HEALTH.eject_after_failures + 1) * INTERVAL + 0.25
        worker.health_status = 200
        took = await _until(lambda: view().healthy, within_s=1.0)
        assert took < (HEALTH.readmit_after_successes + 1) * INTERVAL + 0.25
    finally:
        await prober.close()


async def test_metrics_go_stale_but_worker_stays_healthy(worker: FakeWorker, client: httpx.AsyncClient) -> None:
    b = _backend("w", worker.url)
    prober, state = _prober([b], client)
    await prober.start()
    try:
        await _until(lambda: state.snapshot().backends[0].running == 3, within_s=1.0)
        worker.metrics_status = 500
        await _until(lambda: (state.snapshot().backends[0].metrics_age_s or 0) > 4 * INTERVAL, within_s=1.0)
        v = state.snapshot().backends[0]
        assert v.healthy and v.running == 3 and v.consecutive_failures == 0
        assert v.last_success_age_s is not None and v.last_success_age_s < 4 * INTERVAL
    finally:
        await prober.close()


async def test_dead_worker_is_ejected_and_others_unaffected(
    worker: FakeWorker, dead_url: str, client: httpx.AsyncClient
) -> None:
    backends = [_backend("dead", dead_url), _backend("alive", worker.url)]
    prober, state = _prober(backends, client)
    await prober.start()
    try:
        # (the live worker's first probe may answer after the dead one's third failure on a busy machine)
        await _until(lambda: not state.snapshot().backends[0].healthy and state.any_probe_ok(), within_s=3.0)
        alive = state.snapshot().backends[1]
        assert alive.healthy and alive.consecutive_failures == 0
    finally:
        await prober.close()


async def test_only_dead_workers_never_ready(dead_url: str, client: httpx.AsyncClient) -> None:
    prober, state = _prober([_backend("dead", dead_url)], client)
    await prober.start()
    try:
        await _until(lambda: not state.snapshot().backends[0].healthy, within_s=1.0)
        assert not state.any_probe_ok()
    finally:
        await prober.close()


async def test_cadence_and_clean_close(worker: FakeWorker, client: httpx.AsyncClient) -> None:
    b = _backend("w", worker.url)
    prober, _ = _prober([b], client)
    t0 = asyncio.get_running_loop().time()
    await prober.start()
    await prober.start()  # idempotent: still one task per worker
    await _until(lambda: worker.health_hits >= 8, within_s=5.0)  # a loaded machine may be slower than the cadence
    await prober.close()
    elapsed = asyncio.get_running_loop().time() - t0
    hits = worker.health_hits
    assert hits <= elapsed / INTERVAL + 2  # not faster than the cadence (two tasks per worker would double it)
    await asyncio.sleep(3 * INTERVAL)
    assert worker.health_hits == hits  # no probe after close
    await prober.close()  # closing twice is harmless
