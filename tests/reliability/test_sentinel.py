"""The fleet state behind Redis Sentinel and over TLS: real redis-servers on loopback (a master, its replica and a
Sentinel), the master SIGKILLed under open-loop load, and a TLS-only Redis with a test CA."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import ServerThread, make_config
from tests.redisutil import RedisServer
from tests.reliability.harness import Blackhole, SwitchableWorker, Tally, completion_body, fleet, one_request, until

SERVICE = "chimera-test"
RATE = 20.0  # requests/s, the target's load
BOUND_S = 10.0


class SentinelSet:
    """A master, a replica of it and one Sentinel watching them (quorum 1, down after 1 s)."""

    def __init__(self, tmp_path: Path) -> None:
        self.master = RedisServer()
        self.replica = RedisServer("--replicaof", "127.0.0.1", str(self.master.port))
        conf = tmp_path / "sentinel.conf"  # a Sentinel rewrites its config file: one of its own
        conf.write_text(f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 1\n"
                        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                        f"sentinel failover-timeout {SERVICE} 5000\n")  # fmt: skip
        self.sentinel = RedisServer("--sentinel", conf=str(conf))
        self.servers = (self.master, self.replica, self.sentinel)

    def start(self) -> SentinelSet:
        self.master.start()
        self.replica.start()
        _wait(lambda: redis.Redis(port=self.replica.port).info("replication")["master_link_status"] == "up")
        self.sentinel.start()
        _wait(lambda: len(self.ask().sentinel_slaves(SERVICE)) == 1)
        return self

    def ask(self) -> redis.Redis:
        return redis.Redis(port=self.sentinel.port, decode_responses=True)

    def master_port(self) -> int:
        return int(self.ask().sentinel_get_master_addr_by_name(SERVICE)[1])

    def stop(self) -> None:
        for srv in self.servers:
            srv.remove()


def _wait(cond: object, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            if cond():  # type: ignore[operator]
                return
        except (redis.RedisError, KeyError):
            pass
        assert time.monotonic() < deadline, "redis set-up did not settle"
        time.sleep(0.05)


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    made = SentinelSet(tmp_path).start()
    yield made
    made.stop()


async def open_loop(url: str, *, rate: float, total: int) -> Tally:
    """``total`` requests at ``rate`` per second, evenly spaced, half of them streamed."""
    tally = Tally()
    async with httpx.AsyncClient(timeout=BOUND_S + 5, limits=httpx.Limits(max_connections=200)) as client:

        async def one(i: int) -> None:
            await asyncio.sleep(i / rate)
            body = completion_body(i, stream=i % 2 == 0)
            tally.outcomes.append(await one_request(client, url, body, BOUND_S, None))

        await asyncio.gather(*(one(i) for i in range(total)))
    return tally


@pytest.mark.slow
async def test_sentinel_failover_under_load_loses_nothing(gateway_server: object, fake_server: object,
                                                         sentinel_set: SentinelSet) -> None:  # fmt: skip
    """20 requests/s through a gateway on ``redis+sentinel://``; the master is SIGKILLed. No request fails, the
    state is degraded during the gap and back on Redis (the promoted replica) within 10 s, and no reservation is left
    behind: neither in the gateway's view nor in its load hash on the new master."""
    workers = [fake_server(SwitchableWorker(chunks=8, chunk_delay=0.02)) for _ in range(2)]  # type: ignore[operator]
    state = (f"redis+sentinel://127.0.0.1:{sentinel_set.sentinel.port}/{SERVICE}"
             "?prefix=sent&lease_ttl_s=3&sync_interval_s=0.1")  # fmt: skip
    cfg = make_config([{"name": f"w{i}", "url": w.url, "model": "m"} for i, w in enumerate(workers)],
                      state=state, policy="least_outstanding", health={"probe_interval_s": 0.2})  # fmt: skip
    gw: ServerThread = gateway_server(cfg, probe=True)  # type: ignore[operator]
    assert fleet(gw.url)["state"] == "redis"
    old = sentinel_set.master_port()
    load = asyncio.create_task(open_loop(gw.url, rate=RATE, total=int(RATE * 16)))
    await asyncio.sleep(3.0)
    await asyncio.to_thread(sentinel_set.master.stop)  # SIGKILL
    degraded_s = await until(lambda: fleet(gw.url)["state"] == "degraded", within=3)
    back_s = await until(lambda: fleet(gw.url)["state"] == "redis", within=10)
    tally = await load
    new = sentinel_set.master_port()
    print(f"sentinel failover at {RATE:.0f}/s: {tally.summary()}; degraded {degraded_s:.2f}s after the kill, "
          f"on Redis again (port {old} -> {new}) {back_s + degraded_s:.2f}s after it")  # fmt: skip
    assert new != old
    assert tally.kinds() == {"ok": int(RATE * 16)}, tally.summary()
    assert degraded_s + back_s < 10
    await until(lambda: all(b["inflight_requests"] == 0 and b["inflight_tokens"] == 0
                            for b in fleet(gw.url)["backends"]), within=3)  # fmt: skip
    me = next(r["id"] for r in fleet(gw.url)["replicas"] if r["self"])
    hash_on_new = redis.Redis(port=new, decode_responses=True)

    def published_zero() -> bool:
        h = hash_on_new.hgetall("{sent}:load:" + me)
        return all(h.get(f"w{i}:{k}") == "0" for i in range(2) for k in "rt")

    await until(published_zero, within=2)  # the new master holds no reservation of ours


async def test_a_silent_sentinel_first_in_the_list_is_passed_over(gateway_server: object, fake_server: object,
                                                                   sentinel_set: SentinelSet) -> None:  # fmt: skip
    """The first Sentinel named accepts connections and never answers: the state still finds the master through the
    second, and serves on Redis, within seconds of starting."""
    silent = Blackhole()
    try:
        worker = fake_server(SwitchableWorker(chunks=2, chunk_delay=0.0))  # type: ignore[operator]
        state = (f"redis+sentinel://127.0.0.1:{silent.port},127.0.0.1:{sentinel_set.sentinel.port}/{SERVICE}"
                 "?prefix=silent&sync_interval_s=0.1")  # fmt: skip
        cfg = make_config([{"name": "w0", "url": worker.url, "model": "m"}], state=state)
        gw: ServerThread = gateway_server(cfg)  # type: ignore[operator]
        await until(lambda: fleet(gw.url)["state"] == "redis", within=5)
        async with httpx.AsyncClient(timeout=10) as client:
            out = await one_request(client, gw.url, completion_body(0, stream=False), BOUND_S, None)
        assert out.kind == "ok" and fleet(gw.url)["state"] == "redis"
    finally:
        silent.close()


async def test_the_urls_own_connection_keys_win(sentinel_set: SentinelSet) -> None:
    """Keys the state also sets (``socket_timeout``) may be given in the URL, as on a plain ``redis://`` one."""
    from router.core.config import HealthConfig
    from router.core.stateurl import redis_options
    from router.state.redis_state import RedisFleetState

    url = f"redis+sentinel://127.0.0.1:{sentinel_set.sentinel.port}/{SERVICE}?prefix=keys&socket_timeout=0.5"
    cfg = make_config([{"name": "w0", "url": "http://127.0.0.1:9", "model": "m"}], state=url)
    st = RedisFleetState(cfg.backends, HealthConfig(), redis_options(url))
    await st.start()
    try:
        assert not st.degraded
    finally:
        await st.close()


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[RedisServer, Path]]:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    key, chain, ca_file = tmp_path / "key.pem", tmp_path / "cert.pem", tmp_path / "ca.pem"
    cert.private_key_pem.write_to_path(str(key))
    cert.cert_chain_pems[0].write_to_path(str(chain))
    ca.cert_pem.write_to_path(str(ca_file))
    srv = RedisServer(client={"ssl": True, "ssl_ca_certs": str(ca_file)})
    srv.args = ("--port", "0", "--tls-port", str(srv.port), "--tls-cert-file", str(chain), "--tls-key-file", str(key),
                "--tls-ca-cert-file", str(ca_file), "--tls-auth-clients", "no")  # fmt: skip
    yield srv.start(), ca_file
    srv.remove()


async def test_rediss_state_talks_tls_and_checks_the_certificate(
    gateway_server: object, fake_server: object, tls_redis: tuple[RedisServer, Path]
) -> None:
    srv, ca_file = tls_redis
    worker = fake_server(SwitchableWorker(chunks=2, chunk_delay=0.0))  # type: ignore[operator]
    backends = [{"name": "w0", "url": worker.url, "model": "m"}]
    url = f"rediss://127.0.0.1:{srv.port}/0?prefix=tls&ssl_ca_certs={ca_file}"
    gw: ServerThread = gateway_server(make_config(backends, state=url))  # type: ignore[operator]
    assert fleet(gw.url)["state"] == "redis"
    async with httpx.AsyncClient(timeout=10) as client:
        out = await one_request(client, gw.url, completion_body(0, stream=False), BOUND_S, None)
    assert out.kind == "ok"
    members = redis.Redis(port=srv.port, ssl=True, ssl_ca_certs=str(ca_file)).smembers("{tls}:replicas")
    assert len(members) == 1  # the gateway's replica registered over TLS
    # The same server with the system's CAs only: the certificate is refused and the gateway serves degraded.
    untrusted = gateway_server(make_config(backends, state=f"rediss://127.0.0.1:{srv.port}/0?prefix=tls2"))  # type: ignore[operator]
    assert fleet(untrusted.url)["state"] == "degraded"
