"""Fleet-state faults under load: the gateway's Redis killed and restarted (a private
redis-server), and a gateway replica SIGKILLed with requests in flight on the shared Redis."""

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

import pytest
import yaml

from backends.listen import free_port, wait_ready
from tests.conftest import ServerThread, make_config
from tests.redisutil import SHARED_URL, RedisServer, private_redis, redis_prefix
from tests.reliability.harness import SwitchableWorker, closed_loop, fleet, until

__all__ = ["private_redis", "redis_prefix"]  # fixtures

Gw = Callable[..., ServerThread]
BOUND_S = 10.0


@pytest.mark.slow
async def test_redis_killed_and_restarted_mid_load(gateway_server: Gw, fake_server: Callable[..., ServerThread],
                                                   private_redis: RedisServer) -> None:  # fmt: skip
    workers = [fake_server(SwitchableWorker(chunks=8, chunk_delay=0.01)) for _ in range(2)]
    state = f"{private_redis.url}?prefix=rel&lease_ttl_s=2&sync_interval_s=0.05&op_timeout_s=0.1"
    cfg = make_config([{"name": f"w{i}", "url": w.url, "model": "m"} for i, w in enumerate(workers)],
                      state=state, policy="least_outstanding", health={"probe_interval_s": 0.2})  # fmt: skip
    gw = gateway_server(cfg, probe=True)
    assert fleet(gw.url)["state"] == "redis"
    done = [0]
    load = asyncio.create_task(closed_loop(gw.url, total=400, concurrency=8, bound=BOUND_S,
                                           on_progress=lambda n: done.__setitem__(0, n)))  # fmt: skip
    await until(lambda: done[0] >= 50, within=10)
    await asyncio.to_thread(private_redis.stop)
    killed = time.monotonic()
    degraded_s = await until(lambda: fleet(gw.url)["state"] == "degraded", within=2)
    at_kill = done[0]
    await asyncio.sleep(1.0)  # serving on the local view
    await asyncio.to_thread(private_redis.start)
    restarted = time.monotonic()
    served_while_down = done[0] - at_kill
    back_s = await until(lambda: fleet(gw.url)["state"] == "redis", within=4)
    tally = await load
    print(f"redis outage: {tally.summary()}; degraded {degraded_s:.2f}s after the kill, "
          f"{served_while_down} requests served during the {restarted - killed:.1f}s outage, "
          f"back {back_s:.2f}s after the restart")  # fmt: skip
    assert tally.kinds() == {"ok": 400}, tally.summary()  # zero failed requests
    assert served_while_down > 0
    assert time.monotonic() - restarted < 5
    await until(lambda: [b["inflight_requests"] for b in fleet(gw.url)["backends"]] == [0, 0], within=2)


@pytest.fixture
def replica_setup(fake_server: Callable[..., ServerThread], redis_prefix: str,
                  tmp_path: Path) -> Iterator[tuple[dict[str, Any], subprocess.Popen[bytes], str]]:  # fmt: skip
    """A worker whose answers take 4 s, a Redis-state config on it, and replica B serving that
    config as a `chimera serve` process: (the config's dict, B's process, B's URL)."""
    worker = fake_server(SwitchableWorker(chunks=400, chunk_delay=0.01))
    state = f"{SHARED_URL}?prefix={redis_prefix}&lease_ttl_s={TTL_S}&sync_interval_s=0.05"
    data = {"gateway": {"state": state, "default_agent": "chat", "policy": "least_outstanding"},
            "backends": [{"name": "w0", "url": worker.url, "model": "m", "kv_budget_tokens": 100_000}],
            "agents": [{"name": "chat", "models": ["m"]}]}  # fmt: skip
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data))
    port = free_port()
    cmd = [sys.executable, "-m", "router.cli", "serve", "--config", str(path), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=os.getcwd())
    yield data, proc, f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


TTL_S = 1.0


@pytest.mark.slow
async def test_replica_killed_under_load_its_reservations_expire(
    gateway_server: Gw, replica_setup: tuple[dict[str, Any], subprocess.Popen[bytes], str]
) -> None:
    """Replica B holds 6 long streams when it is SIGKILLed; replica A, with 3 streams of its own,
    sees B's reservations vanish within the lease TTL and loses no request."""
    data, b, b_url = replica_setup
    a = gateway_server(make_config(data["backends"], data["agents"], **data["gateway"]))
    await asyncio.to_thread(wait_ready, b_url + "/health", 15, proc=b)
    long = {"bound": BOUND_S, "stream_share": 1.0, "output_tokens": 400}
    on_b = asyncio.create_task(closed_loop(b_url, total=6, concurrency=6, **long))
    await until(lambda: fleet(a.url)["backends"][0]["inflight_requests"] >= 6, within=5)
    on_a = asyncio.create_task(closed_loop(a.url, total=3, concurrency=3, **long))
    await until(lambda: {r["self"]: r["inflight_requests"] for r in fleet(a.url).get("replicas", [])}
                == {True: 3, False: 6}, within=5)  # fmt: skip
    os.kill(b.pid, signal.SIGKILL)
    reclaimed_s = await until(lambda: fleet(a.url)["backends"][0]["inflight_requests"] == 3, within=TTL_S + 1.5)
    assert [r["self"] for r in fleet(a.url)["replicas"]] == [True]
    tally_a, tally_b = await on_a, await on_b
    print(f"replica kill: B's 6 reservations reclaimed {reclaimed_s:.2f}s after SIGKILL (TTL {TTL_S}s); "
          f"A: {tally_a.summary()}; B's clients: {dict(tally_b.kinds())}")  # fmt: skip
    assert reclaimed_s < TTL_S + 1.0
    assert tally_a.kinds() == {"ok": 3}  # the surviving replica lost nothing
    assert tally_b.hung == 0  # B's own clients see their connections drop at once, not a hang
    await until(lambda: fleet(a.url)["backends"][0]["inflight_requests"] == 0, within=2)
