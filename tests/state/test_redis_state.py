"""What only the Redis state does: replicas sharing load and probes, leases, election, outages."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio

from router.core.config import HealthConfig
from router.core.stateurl import RedisOptions
from router.state.base import ScrapedMetrics
from router.state.redis_state import RedisFleetState
from tests.redisutil import SHARED_URL, RedisServer, private_redis, redis_prefix
from tests.state.test_memory_state import BACKENDS

__all__ = ["private_redis", "redis_prefix"]  # fixtures

HEALTH = HealthConfig(eject_after_failures=2, probe_interval_s=0.2)
Make = Callable[..., Awaitable[RedisFleetState]]


@pytest.fixture
async def replicas(redis_prefix: str) -> AsyncIterator[Make]:
    """``make(url=..., **options)`` → a started replica on the test's prefix; all closed afterwards."""
    made: list[RedisFleetState] = []

    async def make(url: str = SHARED_URL, **options: float | str) -> RedisFleetState:
        opts = {"sync_interval_s": 0.05, **options}
        st = RedisFleetState(BACKENDS, HEALTH, RedisOptions(url, prefix=redis_prefix, **opts))  # type: ignore[arg-type]
        await st.start()
        made.append(st)
        return st

    yield make
    for st in made:
        await st.close()


def load(st: RedisFleetState, name: str) -> tuple[int, int]:
    v = st.snapshot().by_name(name)
    assert v is not None
    return v.inflight_requests, v.inflight_tokens


async def eventually(check: Callable[[], bool], within: float = 3.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_replicas_see_each_others_reservations(replicas: Make) -> None:
    a, b = await replicas(), await replicas()
    r1 = await a.reserve("a", 100)
    await a.reserve("b", 7)
    r3 = await b.reserve("a", 10)  # the reply carries A's numbers for worker a at once
    assert load(b, "a") == (2, 110)
    await eventually(lambda: load(a, "a") == (2, 110) and load(b, "b") == (1, 7))
    ids = {r.id: (r.inflight_requests, r.inflight_tokens, r.is_self) for r in b.replicas()}
    assert ids == {b.replica_id: (1, 10, True), a.replica_id: (2, 107, False)}
    await a.release(r1)
    await b.release(r3)
    await eventually(lambda: load(a, "a") == (0, 0) and load(b, "a") == (0, 0))
    assert a.stats().round_trips > 0 and a.stats().errors == 0


async def test_an_unreadable_value_in_redis_is_skipped_and_the_sync_goes_on(
    replicas: Make, caplog: pytest.LogCaptureFixture
) -> None:
    a, b, c = await replicas(), await replicas(), await replicas()
    await b.reserve("a", 5)
    await c.reserve("a", 7)
    await eventually(lambda: load(a, "a") == (2, 12))
    raw = redis.asyncio.Redis.from_url(SHARED_URL)
    try:
        await raw.hset(a._k_load + b.replica_id, "a:r", "not a number")  # b's load, corrupted
        await raw.hset(a._k_probe + "a", mapping={"at": "yesterday", "by": "someone", "seq": "9"})
        trips = a.stats().round_trips
        await eventually(lambda: a.stats().round_trips > trips + 5)  # the loop goes on
        await c.reserve("a", 1)
        await eventually(lambda: load(a, "a")[1] == 8)  # c's load still counts; b's unreadable one is skipped
        said = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
        assert any("a replica's load" in m for m in said) and any("shared probe" in m for m in said)
        trips = a.stats().round_trips
        await eventually(lambda: a.stats().round_trips > trips + 5)
        assert len([r for r in caplog.records if "unreadable" in r.getMessage()]) == len(said)  # said once, not a sync
    finally:
        await raw.aclose()


def backlog(st: RedisFleetState, name: str) -> int:
    v = st.snapshot().by_name(name)
    assert v is not None
    return v.pending_prefill_tokens


async def test_replicas_see_each_others_prefill_backlog(replicas: Make) -> None:
    """A streamed prompt awaiting its first token is every replica's backlog on that worker: at once
    in the reply to another replica's reservation there, else by the next sync; its first token (no
    round trip of its own) and its release take it off everywhere."""
    a = await replicas(sync_interval_s=30.0, op_timeout_s=2.0)
    b = await replicas(sync_interval_s=0.05, op_timeout_s=2.0)
    long = await a.reserve("a", 9000, prefill=8000)
    short = await b.reserve("a", 400, prefill=300)  # the PUT reply carries A's backlog for worker a
    assert not a.degraded and not b.degraded
    assert backlog(b, "a") == 8300 and backlog(a, "a") == 8000  # A has not synced since (a long interval)
    assert await a.sync()
    assert backlog(a, "a") == 8300 and backlog(a, "b") == 0
    a.first_token(long)
    assert backlog(a, "a") == 300
    assert backlog(b, "a") == 8300  # not yet published: A's next sync carries it
    assert await a.sync()
    await eventually(lambda: backlog(b, "a") == 300)
    await b.release(short)  # released before its first token: off the backlog, and published with the release
    assert await a.sync()
    assert backlog(a, "a") == 0 and backlog(b, "a") == 0
    await a.release(long)
    await eventually(lambda: load(b, "a") == (0, 0) and backlog(b, "a") == 0)


async def test_a_cancelled_caller_neither_leaks_a_reservation_nor_stops_a_release(
    private_redis: RedisServer, replicas: Make
) -> None:
    """A client that hangs up cancels its request's task wherever it is, also mid-reserve or
    mid-release while Redis has not answered yet (here: paused): the load must still come back to
    zero, here and for the other replica."""
    a, b = await replicas(private_redis.url, op_timeout_s=5.0), await replicas(private_redis.url, op_timeout_s=5.0)
    admin = redis.asyncio.Redis(port=private_redis.port)
    try:
        await admin.client_pause(300)
        reserving = asyncio.create_task(a.reserve("a", 100))
        await asyncio.sleep(0.05)  # it has counted the load locally and waits on Redis
        assert load(a, "a") == (1, 100)
        reserving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reserving
        assert load(a, "a") == (0, 0)

        held = await a.reserve("a", 50)
        await eventually(lambda: load(b, "a") == (1, 50))
        await admin.client_pause(300)
        releasing = asyncio.create_task(a.release(held))
        await asyncio.sleep(0.05)
        releasing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await releasing
        assert load(a, "a") == (0, 0)
        await eventually(lambda: load(b, "a") == (0, 0))  # published all the same, once Redis answers
    finally:
        await admin.aclose()


async def test_clean_shutdown_drops_reservations_at_once(replicas: Make) -> None:
    a, b = await replicas(), await replicas(lease_ttl_s=30.0)
    await b.reserve("a", 500)
    await eventually(lambda: load(a, "a") == (1, 500))
    await b.close()
    await eventually(lambda: load(a, "a") == (0, 0), within=1.0)
    assert [r.id for r in a.replicas()] == [a.replica_id]


async def test_one_replica_probes_each_worker_and_all_apply_its_probes(
    replicas: Make,
) -> None:
    a, b = await replicas(), await replicas()
    assert await a.should_probe("a") and await a.should_probe("a")  # the holder keeps it
    assert not await b.should_probe("a")
    assert await b.should_probe("b")  # elected per worker
    probed = time.monotonic()
    await a.record_probe("a", True, ScrapedMetrics(running=3, waiting=1, kv_usage=0.25))
    await eventually(lambda: (v := b.snapshot().by_name("a")) is not None and v.running == 3)
    v = b.snapshot().by_name("a")
    # the age is the probe's, not the sync's: no older than the time since it was recorded (a slow
    # machine may take a while to get here, so no fixed bound)
    assert v is not None and v.kv_usage == 0.25 and v.metrics_age_s is not None
    assert 0.0 <= v.metrics_age_s <= time.monotonic() - probed + 0.05
    assert b.any_probe_ok()
    for _ in range(2):
        await a.record_probe("a", False, None)
        await asyncio.sleep(0.15)  # each published probe is applied once by every replica
    await eventually(lambda: not b.snapshot().backends[0].healthy)
    assert b.snapshot().backends[0].consecutive_failures == 2
    await a.close()  # the goodbye frees its probe leases
    assert await b.should_probe("a")


async def test_replicas_exchange_prefix_index_news(replicas: Make) -> None:
    a, b, c = await replicas(), await replicas(), await replicas()
    got: dict[str, list[tuple[list[int], str]]] = {"a": [], "b": []}
    a.on_shared_prefix(lambda hashes, w: got["a"].append((list(hashes), w)))
    b.on_shared_prefix(lambda hashes, w: got["b"].append((list(hashes), w)))
    await eventually(lambda: a._prefix_seen is not None and b._prefix_seen is not None)  # listening from here
    deep = (255 << 32) | 0xFFFFFFFF  # the largest a prefix hash can be
    a.share_prefix([1, 2, deep], "a")
    c.share_prefix([7], "b")  # c shares without listening (a gateway without a predictor never calls it)
    c.share_prefix([8], "nope")  # a worker the others are not configured with: skipped
    await eventually(lambda: len(got["b"]) == 2 and len(got["a"]) == 1)
    assert sorted(got["b"]) == [([1, 2, deep], "a"), ([7], "b")]
    assert got["a"] == [([7], "b")]  # its own news is not handed back
    await asyncio.sleep(0.2)
    assert len(got["a"]) == 1 and len(got["b"]) == 2  # each entry applied once


async def test_a_late_replica_starts_at_the_streams_end(replicas: Make) -> None:
    a = await replicas()
    a.share_prefix([1], "a")
    await eventually(lambda: a.stats().round_trips > 3)
    b = await replicas()
    got: list[tuple[list[int], str]] = []
    b.on_shared_prefix(lambda hashes, w: got.append((list(hashes), w)))
    await eventually(lambda: b._prefix_seen is not None)
    a.share_prefix([2], "a")
    await eventually(lambda: got == [([2], "a")])


async def test_prefix_stream_replies_of_either_shape_and_stale_news(replicas: Make) -> None:
    a = await replicas()
    got: list[tuple[list[int], str]] = []
    a.on_shared_prefix(lambda hashes, w: got.append((list(hashes), w)))
    now = a._redis_ms
    fresh, old = f"{now}-0", f"{now - 60_000}-0"
    resp2 = [["k", [(fresh, {"r": "other", "d": "a\t1 2\nb\tff"})]]]
    resp3 = {"k": [(fresh, {"r": "other", "d": "a\t3"})]}
    a._read_prefixes(resp2, seen="0-0")
    a._read_prefixes(resp3, seen="0-0")
    assert got == [([1, 2], "a"), ([255], "b"), ([3], "a")] and a._prefix_seen == fresh
    a._read_prefixes([["k", [(old, {"r": "other", "d": "a\t4"})]]], seen="0-0")
    assert len(got) == 3 and a._prefix_seen is None  # old news skipped; so far behind: jump to the end
    assert await a.exchange_prefixes() and a._prefix_seen is not None  # re-positioned


async def test_killed_replica_leaks_nothing_after_its_ttl(replicas: Make, redis_prefix: str) -> None:
    a = await replicas()
    child = f"""
import asyncio, sys
from router.core.config import HealthConfig
from router.core.stateurl import RedisOptions
from router.state.redis_state import RedisFleetState
from tests.state.test_memory_state import BACKENDS
async def main():
    st = RedisFleetState(BACKENDS, HealthConfig(), RedisOptions({SHARED_URL!r}, prefix={redis_prefix!r},
                         lease_ttl_s=0.8, sync_interval_s=0.05))
    await st.start()
    for _ in range(5):
        await st.reserve("a", 1000)
    print("ready", flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", child, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert (await proc.stdout.readline()).strip() == b"ready"
        await eventually(lambda: load(a, "a") == (5, 5000))
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        await eventually(lambda: load(a, "a") == (0, 0), within=3.0)
        assert time.monotonic() - killed < 0.8 + 0.5
        assert [r.id for r in a.replicas()] == [a.replica_id]
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_outage_serves_locally_then_reconciles(private_redis: RedisServer, replicas: Make) -> None:
    a = await replicas(private_redis.url, op_timeout_s=0.05, lease_ttl_s=5.0)
    r1 = await a.reserve("a", 100)
    private_redis.stop()
    t0 = time.monotonic()
    r2 = await a.reserve("a", 50)  # the first call to notice waits at most op_timeout_s
    r3 = await a.reserve("b", 5)
    await a.release(r1)
    assert time.monotonic() - t0 < 0.5
    assert a.degraded and a.stats().degraded_events == 1 and a.stats().errors >= 1
    assert load(a, "a") == (1, 50) and load(a, "b") == (1, 5)  # the local view keeps serving
    assert await a.should_probe("a")  # degraded: probe for yourself
    private_redis.start()  # same port, empty: the reconcile must republish everything
    await eventually(lambda: not a.degraded, within=5.0)
    b = await replicas(private_redis.url)
    assert load(b, "a") == (1, 50) and load(b, "b") == (1, 5)
    await a.release(r2)
    await a.release(r3)
    await eventually(lambda: load(b, "a") == (0, 0) and load(b, "b") == (0, 0))
    assert a.stats().degraded_events == 1


async def test_outage_drops_the_other_replicas_backlog(private_redis: RedisServer, replicas: Make) -> None:
    """Without Redis a replica cannot learn that the others' prompts got their first tokens: it keeps
    their requests and tokens as last seen (conservative for KV room) but drops their seconds-old
    prefill backlog from its view, and learns it again once Redis is back."""
    a = await replicas(private_redis.url, op_timeout_s=0.2)
    b = await replicas(private_redis.url, op_timeout_s=0.2)
    await b.reserve("a", 5000, prefill=4000)
    await eventually(lambda: backlog(a, "a") == 4000)
    private_redis.stop()
    await eventually(lambda: a.degraded)
    assert backlog(a, "a") == 0 and load(a, "a") == (1, 5000)
    private_redis.start()  # empty: B's reconcile republishes its numbers, A reads them again
    await eventually(lambda: backlog(a, "a") == 4000, within=5.0)


async def test_outage_expires_the_other_replicas_load_after_a_lease(private_redis: RedisServer, replicas: Make) -> None:
    """The others' requests and tokens are kept through a short outage, but not past ``lease_ttl_s``, when
    Redis itself would have expired them: else requests long finished would hold capacity for the whole
    outage, and admission would turn work away from an idle fleet."""
    a = await replicas(private_redis.url, op_timeout_s=0.1, lease_ttl_s=1.0)
    b = await replicas(private_redis.url, op_timeout_s=0.1, lease_ttl_s=1.0)
    await b.reserve("a", 5000)
    own = await a.reserve("b", 7)
    await eventually(lambda: load(a, "a") == (1, 5000) and len(a.replicas()) == 2)
    private_redis.stop()
    await eventually(lambda: a.degraded)
    assert load(a, "a") == (1, 5000)  # a short outage: as last seen
    await eventually(lambda: load(a, "a") == (0, 0), within=5.0)
    assert [r.id for r in a.replicas()] == [a.replica_id] and load(a, "b") == (1, 7)  # its own load stays
    await a.release(own)
    private_redis.start()  # B's reconcile republishes its reservation; A learns it again
    await eventually(lambda: load(a, "a") == (1, 5000), within=5.0)


async def test_unreachable_at_start_comes_up_degraded(redis_prefix: str) -> None:
    srv = RedisServer()  # never started: nothing listens on its port
    st = RedisFleetState(BACKENDS, HEALTH, RedisOptions(srv.url, prefix=redis_prefix, op_timeout_s=0.05))
    await st.start()
    try:
        assert st.degraded
        r = await st.reserve("a", 10)
        assert load(st, "a") == (1, 10)
        await st.release(r)
    finally:
        await st.close()


async def _expiries(prefix: str) -> dict[str, int]:
    """Every key under ``prefix`` on the shared Redis, with its PTTL (ms; -1: no expiry)."""
    client = redis.asyncio.Redis.from_url(SHARED_URL, decode_responses=True)
    try:
        keys = [k async for k in client.scan_iter(match="{" + prefix + "}*", count=1000)]
        return {k: int(await client.pttl(k)) for k in keys}
    finally:
        await client.aclose()


async def test_every_key_a_replica_writes_expires(redis_prefix: str) -> None:
    """Whatever a replica writes carries a TTL, whether it dies (what is there while it runs) or stops (what
    its goodbye leaves): none outlives its purpose, none stays for ever; and reserve/release stay one round
    trip each, the expiries riding in the scripts."""
    lease_s = 4.0
    st = RedisFleetState(
        BACKENDS, HEALTH, RedisOptions(SHARED_URL, prefix=redis_prefix, lease_ttl_s=lease_s, sync_interval_s=30.0)
    )  # the test syncs it
    got: list[tuple[list[int], str]] = []
    st.on_shared_prefix(lambda hashes, w: got.append((list(hashes), w)))
    await st.start()
    try:
        before = st.stats().round_trips
        await st.release(await st.reserve("a", 10))
        assert st.stats().round_trips - before == 2
        await st.reserve("b", 20)
        assert await st.should_probe("a")
        await st.record_probe("a", True, ScrapedMetrics(running=1))
        await st.record_probe("b", False, None)
        assert await st.take_tokens("agent-x", 1, 100, 60, 6000) == 0.0
        st.share_prefix([1, 2], "a")
        assert await st.sync() and await st.exchange_prefixes()
        p = "{" + redis_prefix + "}"
        bound_ms = {
            f"{p}:replicas": lease_s * 1000, f"{p}:load:{st.replica_id}": lease_s * 1000,
            f"{p}:probe:a": lease_s * 1000, f"{p}:probe:b": lease_s * 1000,
            f"{p}:lease:a": HEALTH.probe_interval_s * 3 * 1000, f"{p}:bucket:agent-x": 120_000, f"{p}:prefix": 60_000,
        }  # fmt: skip
        running = await _expiries(redis_prefix)
        assert set(running) == set(bound_ms)  # every kind of key was written (else this test proves nothing)
        assert all(0 < running[k] <= bound_ms[k] for k in running), running
    finally:
        await st.close()
    stopped = await _expiries(redis_prefix)
    assert set(stopped) == set(bound_ms) - {f"{p}:replicas", f"{p}:load:{st.replica_id}", f"{p}:lease:a"}
    assert all(0 < stopped[k] <= bound_ms[k] for k in stopped), stopped


async def test_a_shorter_lease_never_shortens_the_replica_set(replicas: Make, redis_prefix: str) -> None:
    """The replica set expires when no replica renews it, but a replica with a short lease does not cut
    short the life of a member whose own load hash lives longer."""
    long = await replicas(lease_ttl_s=30.0)
    short = await replicas(lease_ttl_s=0.5)
    await short.reserve("a", 1)
    assert await short.sync()
    pttl = (await _expiries(redis_prefix))["{" + redis_prefix + "}:replicas"]
    assert 500 < pttl <= 30_000
    await long.close()
    await short.close()
    assert "{" + redis_prefix + "}:replicas" not in await _expiries(redis_prefix)  # the last goodbye empties it
