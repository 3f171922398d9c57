"""FleetState shared by gateway replicas through Redis (``gateway.state: redis://HOST:PORT/DB``).

Each replica keeps the same local :class:`~router.state.table.FleetTable` as the memory state
(same health rules, same cached snapshot, no I/O in ``snapshot()``) and adds what the others see:

* **Load.** ``reserve``/``release`` update the local record first (exact, never lost), then store
  this replica's absolute, versioned numbers for the worker in one script call (``PUT``), whose
  reply is the other replicas' totals for that worker: one round trip each, two per request. The
  numbers are in-flight requests, tokens and the *prefill backlog* (streamed prompts' tokens with no
  first token yet); a first token shrinks the backlog locally and reaches the others with the next
  SYNC (no round trip of its own): the others see it after their own next SYNC or PUT, about two
  ``sync_interval_s`` at most. While degraded, the others' backlog is dropped from the view (it is
  seconds old work, and no SYNC would clear it); their requests and tokens stay as last seen for
  ``lease_ttl_s`` after the last SYNC that answered, then expire as their leases in Redis would.
* **Leases.** A background task runs ``SYNC`` every ``sync_interval_s``: one round trip that
  heartbeats (renews this replica's load hash for ``lease_ttl_s``), republishes all its numbers,
  and reads every live replica's load and every worker's last probe. A replica that dies without
  a goodbye stops renewing; its hash expires and its reservations vanish within the TTL. ``close()``
  deletes them at once.
* **One prober per worker.** ``should_probe`` takes or renews a short per-worker lease (SET NX PX
  in ``ELECT``); the holder probes and publishes the outcome; every replica applies each published
  probe to its own table once (``seq``), so active health is shared. Passive health (request
  outcomes) and the latency EWMAs stay per replica.
* **Prefix index.** What the predictor's prefix index learns (``share_prefix``: block hashes ->
  the worker they were sent to) is queued locally and appended, once per sync, to a capped stream
  (``XADD MAXLEN ~``) in the same pipelined round trip that reads the other replicas' entries
  since the last one seen (``XREAD``); each is handed to ``on_shared_prefix``'s callback. A replica
  reads from where the stream ended when its predictor started listening, skips news older than ``PREFIX_STALE_MS`` (a
  reader that far behind, after an outage, jumps to the end), and queues nothing while degraded.
* **Outage.** Every call is bounded by ``op_timeout_s``. On an error the state turns degraded: it
  logs once, counts it, stops calling Redis on the hot path (reserve/release only touch the local
  table; every replica probes for itself) and the sync task retries with backoff. The first
  successful SYNC republishes this replica's live reservations — the reconcile — and clears it.

Key layout, scripts and what each key expires after: :mod:`router.state.redis_lua`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

import router.state.redis_lua as redis_lua
from router.core.config import BackendConfig, HealthConfig
from router.core.stateurl import RedisOptions
from router.core.types import FleetSnapshot
from router.state.base import Feedback, ReplicaLoad, Reservation, ScrapedMetrics, StateStats
from router.state.buckets import TokenBuckets
from router.state.redis_sentinel import master_kwargs, sentinels
from router.state.table import FleetTable

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 2.0  # the sync task retries a lost Redis at most this far apart
PREFIX_STREAM_LEN = 1_000  # entries kept in the shared prefix stream (one per replica and sync at most)
# A minute without news and the stream goes: each entry is applied within PREFIX_STALE_MS or never, and a
# reader whose stream has gone reads a new one from its start.
PREFIX_STREAM_TTL_MS = 60_000
PREFIX_READ_BATCH = 32  # entries read per sync at most (the rest: the next one)
PREFIX_PENDING_MAX = 1_024  # prompts queued for the next sync at most (the oldest are dropped)
PREFIX_STALE_MS = 5_000  # older news is skipped, and a reader that far behind jumps to the stream's end
PROBE_LEASE_INTERVALS = 3  # a probe lease outlives its holder by this many probe intervals
_Load = tuple[int, int, int]  # a replica's in-flight requests, tokens and pending prefill tokens on a worker


class RedisFleetState:
    """FleetState shared through Redis by every gateway replica naming the same URL and prefix."""

    kind: str = "redis"

    def __init__(
        self,
        backends: Sequence[BackendConfig],
        health: HealthConfig,
        options: RedisOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._table = FleetTable(backends, health, clock)
        self._opts = options
        self.replica_id = options.replica_id or f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        self._reservations: dict[str, Reservation] = {}
        self._ids = itertools.count(1)
        self._version = dict.fromkeys(self._table.records, 0)
        self._probe_seen: dict[str, tuple[str, str]] = {}  # worker -> (seq, at) of the last probe applied
        self._others: dict[str, dict[str, _Load]] = {}  # replica -> worker -> its numbers there
        p = "{" + options.prefix + "}"
        self._k_replicas, self._k_load, self._k_probe, self._k_lease, self._k_prefix = (
            f"{p}:replicas", f"{p}:load:", f"{p}:probe:", f"{p}:lease:", f"{p}:prefix",
        )  # fmt: skip
        self._prefix_out: deque[tuple[str, Sequence[int]]] = deque(maxlen=PREFIX_PENDING_MAX)
        self._prefix_apply: Callable[[Sequence[int], str], None] | None = None
        self._prefix_seen: str | None = None  # the last stream id read (None: not positioned yet)
        self._redis_ms = 0  # Redis's clock at the last SYNC (stream ids are its milliseconds)
        self._probe_lease_ms = int(health.probe_interval_s * PROBE_LEASE_INTERVALS * 1000)
        self._client: aioredis.Redis | None = None
        self._sentinel: Sentinel | None = None
        self._scripts: dict[str, Any] = {}
        self._sync_task: asyncio.Task[None] | None = None
        self._degraded = False
        self._said_unreadable: set[str] = set()  # what unreadable values in Redis were already logged
        self._synced_at: float | None = None  # when the last SYNC answered (the table's clock)
        self._round_trips = self._errors = self._degraded_events = 0
        self._buckets = TokenBuckets(clock)  # rate limits while Redis is unreachable (per replica then)

    # -- lifecycle --

    @property
    def degraded(self) -> bool:
        return self._degraded

    async def start(self) -> None:
        if self._client is not None:
            return
        timeout = self._opts.op_timeout_s
        kwargs: dict[str, Any] = {
            "decode_responses": True, "socket_timeout": timeout, "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0), "client_name": f"chimera-{self.replica_id}",
        }  # fmt: skip
        if self._opts.sentinels:
            self._sentinel = sentinels(self._opts)
            # the URL's own keys win, as redis-py's from_url lets them
            self._client = self._sentinel.master_for(self._opts.service, **{**kwargs, **master_kwargs(self._opts.url)})
        else:
            self._client = aioredis.Redis.from_url(self._opts.url, **kwargs)
        for name in ("PUT", "SYNC", "PUBLISH_PROBE", "ELECT", "GOODBYE", "TAKE_TOKENS"):
            self._scripts[name] = self._client.register_script(getattr(redis_lua, name))
        await self.sync()
        if self._prefix_apply is not None:  # a predictor listens: whatever is shared from now on reaches it
            await self.exchange_prefixes(position=True)
        self._sync_task = asyncio.create_task(self._sync_loop(), name=f"redis-state:{self.replica_id}")

    async def close(self) -> None:
        task, self._sync_task = self._sync_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._client is None:
            return
        if not self._degraded:
            leases = [self._k_lease + w for w in self._table.records]
            await self._call("GOODBYE", [self._key_self(), self._k_replicas, *leases], [self.replica_id])
        client, self._client = self._client, None
        sentinel, self._sentinel = self._sentinel, None
        try:
            await client.aclose()
        finally:
            for asked in sentinel.sentinels if sentinel is not None else ():
                with contextlib.suppress(RedisError, OSError):
                    await asked.aclose()

    # -- reads (local, no I/O) --

    def snapshot(self) -> FleetSnapshot:
        return self._table.snapshot()

    def any_probe_ok(self) -> bool:
        return self._table.any_probe_ok

    def replicas(self) -> tuple[ReplicaLoad, ...]:
        recs = self._table.records.values()
        mine = ReplicaLoad(self.replica_id, True, sum(r.inflight_requests for r in recs),
                           sum(r.inflight_tokens for r in recs))  # fmt: skip
        others = (
            ReplicaLoad(rid, False, sum(n[0] for n in load.values()), sum(n[1] for n in load.values()))
            for rid, load in sorted(self._others.items())
        )
        return (mine, *others)

    def stats(self) -> StateStats:
        return StateStats(self._round_trips, self._errors, self._degraded_events)

    # -- in-flight accounting --

    async def reserve(self, backend: str, tokens: int, prefill: int = 0) -> Reservation:
        res = Reservation(id=f"{self.replica_id}-{next(self._ids)}", backend=backend, tokens=max(0, tokens))
        self._table.add_load(backend, 1, res.tokens)
        self._table.start_prefill(res.id, backend, prefill)
        self._reservations[res.id] = res
        try:
            await self._put(backend)
        except asyncio.CancelledError:
            await self.release(res)  # the cancelled caller never gets the reservation: give it back now
            raise
        return res

    async def release(self, reservation: Reservation) -> None:
        res = self._reservations.pop(reservation.id, None)
        if res is not None:
            self._table.add_load(res.backend, -1, -res.tokens)
            self._table.end_prefill(res.id)
            await asyncio.shield(self._put(res.backend))  # published even if the caller is cancelled

    def first_token(self, reservation: Reservation) -> None:
        backend = self._table.end_prefill(reservation.id)
        if backend is not None:
            self._version[backend] += 1  # no round trip: the next SYNC (or PUT) publishes the smaller backlog

    async def _put(self, backend: str) -> None:
        self._version[backend] += 1
        if self._degraded:
            return  # the next successful SYNC republishes it
        rec = self._table.records[backend]
        args: list[str | int] = [self.replica_id, self._ttl_ms(), self._k_load, backend, self._version[backend],
                                 rec.inflight_requests, rec.inflight_tokens, rec.pending_prefill]  # fmt: skip
        reply = await self._call("PUT", [self._key_self(), self._k_replicas], args)
        if reply is not None:
            self._table.set_other_load(backend, int(reply[0]), int(reply[1]), int(reply[2]))

    async def take_tokens(self, agent: str, requests: int, tokens: int, rpm: int | None, tpm: int | None) -> float:
        if rpm is None and tpm is None:
            return 0.0
        reply = await self._call("TAKE_TOKENS", ["{" + self._opts.prefix + "}:bucket:" + agent],
                                 [rpm or 0, tpm or 0, requests, tokens])  # fmt: skip
        if reply is None:
            return self._buckets.take(agent, requests, tokens, rpm, tpm)
        return float(reply)

    # -- health --

    async def should_probe(self, backend: str) -> bool:
        if backend not in self._table.records:
            raise ValueError(f"unknown backend {backend!r}")
        if self._degraded:
            return True  # better N probes than none
        won = await self._call("ELECT", [self._k_lease + backend], [self.replica_id, self._probe_lease_ms])
        return won is None or bool(won)

    async def record_probe(self, backend: str, ok: bool, metrics: ScrapedMetrics | None) -> None:
        self._table.probe(backend, ok, metrics)
        if not self._degraded:
            m = "" if metrics is None else json.dumps(dataclasses.asdict(metrics))
            # expires after a lease: an older probe is no evidence (_apply_probe), and no fleet left keeps it
            await self._call("PUBLISH_PROBE", [self._k_probe + backend], [self.replica_id, int(ok), m, self._ttl_ms()])

    async def record_result(
        self,
        backend: str,
        ok: bool,
        *,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        feedback: Feedback | None = None,
    ) -> None:
        self._table.result(backend, ok, ttft_s, tpot_s, feedback)

    # -- sync --

    async def sync(self) -> bool:
        """One SYNC round trip (heartbeat, republish, read). False when Redis did not answer."""
        if self._degraded and self._sentinel is not None:
            await self._find_master()
        workers = list(self._table.records.values())
        args: list[str | int] = [self.replica_id, self._ttl_ms(), self._k_load, self._k_probe, len(workers)]
        for r in workers:
            args += [r.name, self._version[r.name], r.inflight_requests, r.inflight_tokens, r.pending_prefill]
        reply = await self._call("SYNC", [self._key_self(), self._k_replicas], args, while_degraded=True)
        if reply is None:
            self._expire_others()
            return False
        self._synced_at = self._table.clock()
        if self._degraded:
            self._degraded = False
            log.warning("fleet state: Redis is back; republished this replica's reservations")
        try:
            replicas, probes, now_ms = reply
            self._redis_ms = int(now_ms)
        except (ValueError, TypeError) as exc:  # not the script's reply: Redis answered, the view stays as it was
            self._unreadable("the SYNC reply", exc)
            return True
        self._apply_load(replicas)
        for rec, flat in zip(workers, probes, strict=False):
            try:
                self._apply_probe(rec.name, _pairs(flat), int(now_ms))
            except (ValueError, TypeError, KeyError) as exc:
                self._unreadable(f"worker {rec.name}'s shared probe", exc)
        return True

    def _unreadable(self, what: str, exc: Exception) -> None:
        """A value in Redis this replica cannot read (written by something else, or corrupted): skipped, and said
        once per ``what`` (a sync runs ten times a second)."""
        if what not in self._said_unreadable:
            self._said_unreadable.add(what)
            log.warning("fleet state: unreadable %s in Redis (%s: %s); skipped", what, type(exc).__name__, exc)

    async def _sync_loop(self) -> None:
        task = asyncio.current_task()
        delay = self._opts.sync_interval_s
        while True:
            await asyncio.sleep(delay)
            try:
                ok = await self.sync()
                if ok and (self._prefix_out or self._prefix_apply is not None):
                    await self.exchange_prefixes()
            except Exception:  # a bug must not end the loop silently: the view would freeze for good
                log.exception("fleet state: the sync with Redis failed; retrying")
                ok = False
            if task is not None and task.cancelling():
                # A cancel that arrived as Redis answered can be swallowed inside redis-py (CPython
                # 3.11's asyncio.wait_for returns the result instead): honour it here, or close()
                # and the event loop's shutdown would wait on this loop for ever.
                raise asyncio.CancelledError
            delay = self._opts.sync_interval_s if ok else min(MAX_BACKOFF_S, delay * 2)

    def _expire_others(self) -> None:
        """Out of touch with Redis for longer than a lease: the other replicas' numbers have expired there
        (``lease_ttl_s``), so they expire here too. Kept as last seen, requests long finished would hold
        their capacity for the whole outage (admission would turn work away from an idle fleet)."""
        if not self._others or self._synced_at is None:
            return
        if self._table.clock() - self._synced_at < self._opts.lease_ttl_s:
            return
        log.warning("fleet state: no word from Redis for %.0f s; other replicas' load dropped", self._opts.lease_ttl_s)
        self._apply_load([])

    def _apply_load(self, replicas: list[list[Any]]) -> None:
        others: dict[str, dict[str, _Load]] = {}
        for entry in replicas:
            try:
                rid, flat = entry
                if rid == self.replica_id:
                    continue
                h = _pairs(flat)
                others[rid] = {
                    w: (int(h.get(w + ":r", 0)), int(h.get(w + ":t", 0)), int(h.get(w + ":p", 0)))
                    for w in self._table.records
                    if w + ":v" in h
                }
            except (ValueError, TypeError) as exc:  # one replica's load unreadable: the others' still count
                self._unreadable("a replica's load", exc)
        self._others = others
        for w in self._table.records:
            loads = [load[w] for load in others.values() if w in load]
            self._table.set_other_load(w, *(sum(n[k] for n in loads) for k in range(3)))

    def _apply_probe(self, backend: str, h: dict[str, str], now_ms: int) -> None:
        # (seq, at) rather than seq alone: a restarted Redis starts counting again.
        seen = (h.get("seq", ""), h.get("at", ""))
        if seen == self._probe_seen.get(backend):
            return
        self._probe_seen[backend] = seen
        if h.get("by") == self.replica_id or "at" not in h:
            return  # our own probe, applied when it was recorded
        age_s = max(0.0, (now_ms - int(h["at"])) / 1000.0)
        if age_s > self._opts.lease_ttl_s:
            return  # left by a fleet long gone: not evidence about the worker now
        metrics = _metrics(h["m"]) if h.get("mat") == h["at"] and h.get("m") else None
        self._table.probe(backend, h.get("ok") == "1", metrics, self._table.clock() - age_s)

    # -- prefix index --

    def share_prefix(self, hashes: Sequence[int], backend: str) -> None:
        if hashes and not self._degraded:
            self._prefix_out.append((backend, hashes))

    def on_shared_prefix(self, apply: Callable[[Sequence[int], str], None]) -> None:
        self._prefix_apply = apply

    async def exchange_prefixes(self, *, position: bool = False) -> bool:
        """One pipelined round trip: append what this replica learnt, read what the others did
        (``position``: only note where the stream ends now, to read from there, as at start-up).
        False when Redis did not answer (the queued news is dropped: the index is a guess anyway)."""
        out = [f"{b}\t{' '.join(format(h, 'x') for h in hs)}" for b, hs in self._prefix_out]
        self._prefix_out.clear()
        listen = position or self._prefix_apply is not None
        seen = None if position else self._prefix_seen
        if not out and not listen:
            return True

        async def pipeline() -> list[Any]:
            assert self._client is not None
            pipe = self._client.pipeline(transaction=False)
            if out:
                pipe.xadd(self._k_prefix, {"r": self.replica_id, "d": "\n".join(out)},
                          maxlen=PREFIX_STREAM_LEN, approximate=True)  # fmt: skip
                pipe.pexpire(self._k_prefix, PREFIX_STREAM_TTL_MS)
            if listen:
                if seen is None:
                    pipe.xrevrange(self._k_prefix, count=1)  # start at the end (after our own entry)
                else:
                    pipe.xread({self._k_prefix: seen}, count=PREFIX_READ_BATCH)
            return list(await pipe.execute())

        replies = await self._round_trip(pipeline)
        if replies is None:
            return False
        if not listen:
            return True
        try:
            self._read_prefixes(replies[-1], seen)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:  # a reply of another shape
            self._errors += 1
            self._prefix_seen = None  # start again at the stream's end
            log.warning("fleet state: unreadable prefix stream reply (%s); skipped", exc)
            return False
        return True

    def _read_prefixes(self, reply: Any, seen: str | None) -> None:
        if seen is None:  # XREVRANGE's newest entry, if any: read from after it
            self._prefix_seen = reply[0][0] if reply else "0-0"
            return
        stale = self._redis_ms - PREFIX_STALE_MS
        entries = _stream_entries(reply)
        for entry_id, fields in entries:
            self._prefix_seen = entry_id
            if fields.get("r") != self.replica_id and int(entry_id.partition("-")[0]) >= stale:
                self._apply_prefixes(fields.get("d", ""))
        if entries and int(entries[-1][0].partition("-")[0]) < stale:
            self._prefix_seen = None  # this far behind: jump to the end rather than read old news

    def _apply_prefixes(self, data: str) -> None:
        apply, known = self._prefix_apply, self._table.records
        assert apply is not None
        for line in data.split("\n"):
            backend, _, raw = line.partition("\t")
            if backend not in known:
                continue  # a worker this replica is not configured with
            try:
                hashes = [int(x, 16) for x in raw.split()]
            except ValueError:
                continue  # not ours to apply (another version's format)
            apply(hashes, backend)

    # -- plumbing --

    async def _call(self, script: str, keys: list[str], args: Sequence[str | int], *,
                    while_degraded: bool = False) -> Any:  # fmt: skip
        """One round trip; None on any Redis failure (the state turns degraded), never raises."""
        return await self._round_trip(lambda: self._scripts[script](keys=keys, args=args), while_degraded)

    async def _round_trip(self, op: Callable[[], Awaitable[Any]], while_degraded: bool = False) -> Any:
        if self._client is None or (self._degraded and not while_degraded):
            return None
        self._round_trips += 1
        try:
            async with asyncio.timeout(self._opts.op_timeout_s):
                return await op()
        except (RedisError, OSError, TimeoutError) as exc:
            self._errors += 1
            if not self._degraded:
                self._degraded = True
                self._degraded_events += 1
                self._table.drop_other_prefill()  # seconds-old work that no SYNC will clear now
                why = str(exc) or type(exc).__name__  # a timeout's message is empty
                log.warning("fleet state: Redis unreachable (%s); serving on the local view", why)
            return None

    async def _find_master(self) -> None:
        """Ask the Sentinels where the master is, each within ``op_timeout_s``, before a degraded state's next SYNC:
        the one that answers moves to the front of redis-py's list, so the SYNC's own connection asks it first (a
        silent Sentinel first in the list would otherwise use up every round trip's ``op_timeout_s``)."""
        assert self._sentinel is not None
        budget = self._opts.op_timeout_s * (len(self._sentinel.sentinels) + 1)
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(budget):
                await self._sentinel.discover_master(self._opts.service)

    def _key_self(self) -> str:
        return self._k_load + self.replica_id

    def _ttl_ms(self) -> int:
        return int(self._opts.lease_ttl_s * 1000)


def _pairs(flat: list[str]) -> dict[str, str]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _metrics(raw: str) -> ScrapedMetrics | None:
    try:
        data = json.loads(raw)
        return ScrapedMetrics(**{f.name: data.get(f.name) for f in dataclasses.fields(ScrapedMetrics)})
    except (ValueError, TypeError, AttributeError):
        return None


def _stream_entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """XREAD's entries, whichever shape redis-py gives them: ``[[stream, [(id, fields), ...]]]``
    (RESP2, and RESP3 with its default legacy shapes) or ``{stream: [(id, fields), ...]}``."""
    if not reply:
        return []
    streams = reply.values() if isinstance(reply, dict) else (entries for _, entries in reply)
    return [(entry_id, fields) for entries in streams for entry_id, fields in entries]
