"""Two gateway replicas sharing fleet state through Redis: one in this process, one a real
`chimera serve` subprocess that is SIGKILLed mid-load. Workers stall, so reservations stay open."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from backends.listen import free_port, wait_ready
from tests.conftest import ServerThread, make_config
from tests.e2e.fakes import FakeWorker
from tests.redisutil import SHARED_URL, redis_prefix

__all__ = ["redis_prefix"]  # a fixture

TTL_S = 1.0


@pytest.fixture
def stalling_worker() -> Iterator[ServerThread]:
    with ServerThread(FakeWorker(mode="stall"), log_level="critical") as srv:
        yield srv


def _fleet(url: str) -> dict[str, Any]:
    return httpx.get(url + "/fleet", timeout=2).json()  # type: ignore[no-any-return]


def _inflight(url: str) -> tuple[int, int]:
    b = _fleet(url)["backends"][0]
    return b["inflight_requests"], b["inflight_tokens"]


async def _until(cond: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(cond):
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.fixture
def replica_config(tmp_path: Path, redis_prefix: str, stalling_worker: ServerThread) -> tuple[Path, dict[str, Any]]:
    """A gateway config on the stalling worker with a Redis state: (its YAML file, its dict)."""
    state = f"{SHARED_URL}?prefix={redis_prefix}&lease_ttl_s={TTL_S}&sync_interval_s=0.05"
    data = {
        "gateway": {"state": state, "default_agent": "chat", "policy": "round_robin"},
        "backends": [{"name": "w0", "url": stalling_worker.url, "model": "m", "kv_budget_tokens": 100_000}],
        "agents": [{"name": "chat", "models": ["m"]}],
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, data


@pytest.fixture
def replica_b(replica_config: tuple[Path, dict[str, Any]]) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`chimera serve` in a subprocess: (the process, its URL)."""
    port = free_port()
    cmd = [sys.executable, "-m", "router.cli", "serve", "--config", str(replica_config[0]), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=os.getcwd())
    yield proc, f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


@pytest.mark.slow
async def test_replicas_share_reservations_and_a_killed_one_leaks_nothing(
    replica_config: tuple[Path, dict[str, Any]], replica_b: tuple[subprocess.Popen[bytes], str],
    gateway_server: Callable[..., ServerThread],
) -> None:  # fmt: skip
    data = replica_config[1]
    a = gateway_server(make_config(data["backends"], data["agents"], **data["gateway"]))
    b, b_url = replica_b
    body = {"model": "m", "prompt": "hello there", "max_tokens": 100}
    on_a: asyncio.Task[httpx.Response] | None = None
    async with httpx.AsyncClient(timeout=30) as client:
        try:
            await asyncio.to_thread(wait_ready, b_url + "/health", 15, proc=b)
            on_b = [asyncio.create_task(client.post(b_url + "/v1/completions", json=body)) for _ in range(4)]
            on_a = asyncio.create_task(client.post(a.url + "/v1/completions", json=body))
            await _until(lambda: _inflight(a.url)[0] == 5 and _inflight(b_url)[0] == 5)
            fleet = _fleet(a.url)
            assert fleet["state"] == "redis"
            mine = {r["self"]: r["inflight_requests"] for r in fleet["replicas"]}
            assert mine == {True: 1, False: 4}
            tokens_a = _inflight(a.url)[1] // 5  # every request reserves the same
            metrics = (await client.get(a.url + "/metrics")).text
            assert "chimera_state_redis_commands_total" in metrics and "chimera_state_replicas 2.0" in metrics

            os.kill(b.pid, signal.SIGKILL)  # no goodbye: its reservations must expire with its lease
            killed = time.monotonic()
            await _until(lambda: _inflight(a.url) == (1, tokens_a), within=TTL_S + 2)
            assert time.monotonic() - killed < TTL_S + 1.0
            assert [r["self"] for r in _fleet(a.url)["replicas"]] == [True]
            for t in on_b:
                with pytest.raises(httpx.HTTPError):
                    await t
        finally:
            if on_a is not None:  # hanging up releases its reservation
                on_a.cancel()
                await asyncio.gather(on_a, return_exceptions=True)
    await _until(lambda: _inflight(a.url) == (0, 0))
