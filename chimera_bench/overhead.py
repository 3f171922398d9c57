"""`chimera bench --workload overhead`: what the gateway adds in front of a worker that costs nothing.

A :mod:`chimera_bench.fastworker` process answers at once; the same open-loop Poisson stream of
small streamed chat requests goes to it directly and then through a gateway, at each rate. The
client is a bare asyncio HTTP/1.1 client (keep-alive pool of at most 128 connections, chunked
bodies) so that it stays far cheaper than what it measures. Latency runs from a request's
*scheduled* arrival to the end of its body (no coordinated omission: a saturated server shows
as queueing). Pinning (Linux ``sched_setaffinity``, what ``taskset -c`` does): the router on the
first core (``--replicas N``: chimera's N processes, each on a port of its own, on the first N cores,
the client opening its connections to each in turn), the
client on the next, the worker on the one after where there is one, else with the client. Each
router's saturation rate, the highest rate of the sweep it holds (throughput within 1 % of the
worker's own on the same arrivals, no error, p99 under 50 ms), goes to ``DIR/saturation.json``. ``--peers floor``
adds :mod:`chimera_bench.floorproxy`, the server and client the gateway is built on with nothing
of its own. Finally the gateway is run once more under cProfile at the first rate, and its profile
is written to ``DIR/gateway-profile.{prof,txt}``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from backends.listen import free_port, wait_ready
from chimera_bench import gateway_proc
from chimera_bench.stats import quantiles

FLOOR = "floor"  # the peer name of chimera_bench.floorproxy
MAX_CONNECTIONS = 128  # like `vllm bench serve --max-concurrency`: an overloaded server queues, not drowns
_PROMPT = [{"role": "user", "content": "say eight short words about routers please"}]


def body(stream: bool = True, model: str = "auto") -> bytes:
    return json.dumps({"model": model, "stream": stream, "max_tokens": 16, "messages": _PROMPT}).encode()


BODY = body()
CONFIG = """gateway: {{host: 127.0.0.1, port: {gw_port}, state: memory, policy: round_robin, default_agent: chat}}
backends:
  - {{name: fast-0, url: "http://127.0.0.1:{worker_port}", model: fast, kv_budget_tokens: 1000000}}
agents:
  - {{name: chat, models: [fast]}}
"""


def request_head(host: str, payload: bytes, extra_headers: str = "") -> bytes:
    """The whole HTTP/1.1 request a load client sends for a chat completion of ``payload``."""
    return (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"{extra_headers}content-length: {len(payload)}\r\n\r\n").encode() + payload  # fmt: skip


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.answered = False  # whether any byte of the current request's answer arrived

    async def request(self, head: bytes) -> None:
        self.answered = False
        self.writer.write(head)
        status = await self.reader.readuntil(b"\r\n")
        self.answered = True
        if b" 200 " not in status:
            raise ConnectionError(status.decode(errors="replace").strip())
        length, chunked = None, False
        while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if not chunked:
            await self.reader.readexactly(length or 0)
            return
        while (size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)) > 0:
            await self.reader.readexactly(size + 2)
        await self.reader.readuntil(b"\r\n")


async def offer(
    url: str, rate: float, duration_s: float, warmup_s: float, seed: int, payload: bytes = BODY, auth: str = "",
    spread: tuple[str, ...] = (), raw: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Poisson arrivals at ``rate``/s for ``warmup_s + duration_s``; stats over the measured part. ``payload``:
    the request body (default: streamed, ``model: auto``); ``auth``: a bearer token to send; ``spread``: more
    servers of the same service, new connections going to each in turn (as a load balancer sends them); ``raw``: the
    measured latencies too (``latencies_ms``)."""
    addresses = [(h, int(p)) for h, p in (u.removeprefix("http://").split(":") for u in (url, *spread))]
    host = addresses[0][0]
    opened = [0]
    key = f"authorization: Bearer {auth}\r\n" if auth else ""
    head = request_head(host, payload, key)
    idle: list[_Conn] = []
    lat: list[tuple[float, float]] = []  # (scheduled arrival, latency)
    errors = [0]
    kinds: collections.Counter[str] = collections.Counter()  # what the measured errors were
    reconnects = [0]  # requests sent again on a new connection: the server had closed the idle one
    rng = random.Random(f"overhead:{seed}:{rate}")
    slots = asyncio.Semaphore(MAX_CONNECTIONS)
    horizon = warmup_s + duration_s

    async def one(at: float, t0: float) -> None:
        async with slots:  # at most MAX_CONNECTIONS in flight; the rest queue here (and it shows)
            await _one(at, t0)

    async def _one(at: float, t0: float) -> None:
        conn = idle.pop() if idle else None
        try:
            if conn is not None:
                try:
                    await asyncio.wait_for(conn.request(head), timeout=10.0)
                except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError) as exc:
                    if conn.answered or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                        raise  # a broken answer is an error
                    # the server closed this idle keep-alive connection (uvicorn: after 5 s) as we
                    # reused it, before any byte of an answer: a new connection, as HTTP clients do
                    conn.writer.close()
                    conn = None
                    reconnects[0] += at >= warmup_s
            if conn is None:
                opened[0] += 1
                conn = _Conn(*await asyncio.open_connection(*addresses[opened[0] % len(addresses)]))
                await asyncio.wait_for(conn.request(head), timeout=10.0)
            lat.append((at, time.monotonic() - t0 - at))
            idle.append(conn)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
            if at >= warmup_s:
                errors[0] += 1
                kinds[f"{type(exc).__name__}: {exc}"[:120]] += 1
            if conn is not None:
                conn.writer.close()

    tasks: list[asyncio.Task[None]] = []
    t0 = time.monotonic()
    at = 0.0
    while (at := at + rng.expovariate(rate)) < horizon:
        await asyncio.sleep(max(0.0, at - (time.monotonic() - t0)))
        tasks.append(asyncio.create_task(one(at, t0)))
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=15.0)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        errors[0] += len(pending)
        if pending:
            kinds["unfinished after 15 s"] += len(pending)
    for conn in idle:
        conn.writer.close()
    measured = [ms * 1000 for a, ms in lat if a >= warmup_s]
    finished = [a for a, ms in lat if warmup_s <= a + ms < horizon]
    got = {"requests": len(measured) + errors[0], "sent": len(tasks), "errors": errors[0], "error_kinds": dict(kinds),
           "reconnects": reconnects[0],
           "rps": round(len(finished) / duration_s, 1), "e2e_ms": quantiles(measured)}  # fmt: skip
    return got | {"latencies_ms": measured} if raw else got


def run_overhead(
    *, rates: tuple[float, ...], duration_s: float, warmup_s: float, out: str, pin: bool = True, seed: int = 0,
    peers: tuple[str, ...] = (), streams: tuple[bool, ...] = (True,), replicas: int = 1,
) -> list[dict[str, Any]]:  # fmt: skip
    """At each rate and for each of ``streams`` (streamed, non-streamed): the worker directly, then through
    chimera (round robin; ``replicas`` processes), then through each of ``peers`` (``NAME:POLICY``,
    bench.peers, or ``floor``) on the first core."""
    from rich.console import Console

    from chimera_bench import peers as peer_mod
    from router.core.config import load_config

    for spec in peers:
        if spec != FLOOR:
            peer_mod.check_installed(peer_mod.parse(spec)[0])
    console = Console(stderr=True)
    dest = Path(out)
    (dest / "logs").mkdir(parents=True, exist_ok=True)
    wport, gport = free_port(), free_port()
    cfg_path = dest / "overhead-config.yaml"
    cfg_path.write_text(CONFIG.format(gw_port=gport, worker_port=wport), encoding="utf-8")
    can_pin = pin and hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= replicas + 1
    cores = sorted(os.sched_getaffinity(0)) if can_pin else []
    gw_cpus: list[int | None] = list(cores[:replicas]) if can_pin else [None] * replicas
    gw_cpu, client_cpu = gw_cpus[0], cores[replicas] if can_pin else None
    worker_cpu = cores[replicas + 1] if len(cores) > replicas + 1 else client_cpu
    worker_url, gw_url = f"http://127.0.0.1:{wport}", f"http://127.0.0.1:{gport}"
    entries: list[dict[str, Any]] = []
    before = os.sched_getaffinity(0) if can_pin else None
    worker = gateway_proc.start([sys.executable, "-m", "chimera_bench.fastworker", "--port", str(wport)],
                                dest / "logs" / "fastworker.log", cpu=worker_cpu)  # fmt: skip
    try:
        wait_ready(worker_url + "/health", proc=worker)
        if client_cpu is not None:
            os.sched_setaffinity(0, {client_cpu})
        fleet = load_config(cfg_path)
        for rate in rates:  # each router is started once per rate and measured for every one of ``streams``
            direct = {stream: asyncio.run(offer(worker_url, rate, duration_s, warmup_s, seed, body(stream)))
                      for stream in streams}  # fmt: skip
            rows: dict[bool, list[tuple[str, dict[str, Any]]]] = {stream: [] for stream in streams}
            name = "round_robin" if replicas == 1 else f"round_robin x{replicas}"
            with _gateway(str(cfg_path), gport, dest / "logs" / "gateway-overhead.log", gw_cpus, None) as procs:
                more = tuple(f"http://127.0.0.1:{port}" for _, port in procs[1:])
                for stream in streams:
                    rows[stream].append((name, _costed([proc.pid for proc, _ in procs], offer(
                        gw_url, rate, duration_s, warmup_s, seed, body(stream), spread=more))))  # fmt: skip
            for spec in peers:
                if spec == FLOOR:
                    with _floor(worker_url, dest / "logs" / "floor.log", gw_cpu) as (proc, url):
                        for stream in streams:
                            rows[stream].append((FLOOR, _costed([proc.pid], offer(url, rate, duration_s, warmup_s,
                                                                                  seed, body(stream)))))  # fmt: skip
                    continue
                tag = f"overhead-{spec.replace(':', '-')}-{rate:g}"
                with peer_mod.running(spec, fleet, dest / "logs", tag, cpu=gw_cpu) as routes:
                    route = routes["chat"]
                    for stream in streams:
                        rows[stream].append((spec, _costed(route.pids, offer(
                            route.url, rate, duration_s, warmup_s, seed, body(stream, route.model),
                            route.api_key))))  # fmt: skip
            for stream in streams:
                for name, measured in rows[stream]:
                    entries.append(_entry(rate, direct[stream], measured, duration_s, warmup_s, can_pin, cores, name,
                                          stream, replicas))  # fmt: skip
                    console.print(
                        f"overhead {name} rate={rate:g} {'streamed' if stream else 'non-streamed'}: direct "
                        f"{direct[stream]['rps']} rps, p50 {direct[stream]['e2e_ms']['p50']} ms; through it "
                        f"{measured['rps']} rps, p50 {measured['e2e_ms']['p50']} ms; {measured['errors']} errors"
                    )
            (dest / "results.json").write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
            (dest / "saturation.json").write_text(json.dumps(saturation(entries), indent=1) + "\n",
                                                  encoding="utf-8")  # fmt: skip
        with _gateway(str(cfg_path), gport, dest / "logs" / "gateway-profile.log", [gw_cpu],
                      str(dest / "gateway-profile")):  # fmt: skip
            asyncio.run(offer(gw_url, rates[0], duration_s, 0.0, seed))
    finally:
        gateway_proc.stop(worker)
        if before is not None:
            os.sched_setaffinity(0, before)
    _print(entries)
    return entries


@contextlib.contextmanager
def _gateway(cfg: str, port: int, log: Path, cpus: list[int | None], profile: str | None) -> Any:
    """One gateway process per entry of ``cpus`` (pinned there), the first on ``port``, the others each on a port of
    its own; yields each with its port. (Not one port shared with SO_REUSEPORT: where the kernel does not spread
    the connections, as in some sandboxes, one process would take them all.)"""
    procs: list[tuple[subprocess.Popen[bytes], int]] = []
    try:
        for i, cpu in enumerate(cpus):
            at = port if i == 0 else free_port()
            cmd = gateway_proc.command(cfg, at, policy=None, profile=profile)
            procs.append((gateway_proc.start(cmd, log.with_name(f"{log.stem}-{i}{log.suffix}") if i else log,
                                             cpu=cpu), at))  # fmt: skip
            wait_ready(f"http://127.0.0.1:{at}/ready", proc=procs[-1][0])
        yield procs
    finally:
        for proc, _ in procs:
            gateway_proc.stop(proc, timeout_s=30.0)


@contextlib.contextmanager
def _floor(worker_url: str, log: Path, cpu: int | None) -> Any:
    port = free_port()
    cmd = [sys.executable, "-m", "chimera_bench.floorproxy", "--port", str(port)]
    proc = gateway_proc.start(cmd, log, cpu=cpu, env={**os.environ, "FLOOR_WORKER": worker_url})
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", proc=proc)
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        gateway_proc.stop(proc, timeout_s=30.0)


def _costed(pids: Any, run: Any) -> dict[str, Any]:
    """``run`` (an ``offer``) to its end, and the CPU the router's processes spent on it per request sent."""
    before = _cpu_s(pids)
    got: dict[str, Any] = asyncio.run(run)
    after = _cpu_s(pids)
    spent = None if before is None or after is None or not got["sent"] else (after - before) / got["sent"]
    got["cpu_us_per_request"] = None if spent is None else round(spent * 1e6, 1)
    return got


def _cpu_s(pids: Any) -> float | None:
    """User + system CPU seconds of the processes ``pids`` (every thread of each) so far; None where /proc does
    not tell."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        total += int(fields[11]) + int(fields[12])  # utime, stime (after the name: fields 14 and 15 of proc(5))
    return total / os.sysconf("SC_CLK_TCK")


SATURATED_P99_MS = 50.0


def saturation(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per router and stream setting: the highest rate it held (throughput within 1 % of the worker's direct,
    no error, p99 under SATURATED_P99_MS), and the lowest it did not; None where the sweep had none."""
    out = []
    for key in dict.fromkeys((e["policy"], e.get("stream", True)) for e in entries):
        runs = sorted((e for e in entries if (e["policy"], e.get("stream", True)) == key), key=lambda e: e["rate"])
        held = [e["rate"] for e in runs if _held(e)]
        failed = [e["rate"] for e in runs if not _held(e)]
        out.append({"policy": key[0], "stream": key[1], "held_rps": max(held, default=None),
                    "failed_rps": min(failed, default=None), "p99_limit_ms": SATURATED_P99_MS})  # fmt: skip
    return out


def _held(e: dict[str, Any]) -> bool:
    p99 = e["e2e_ms"]["p99"]
    ratio = e["throughput_ratio"]  # against the worker direct, on the same arrivals
    return not e["errors"] and ratio is not None and ratio >= 0.99 and p99 is not None and p99 < SATURATED_P99_MS


def _entry(
    rate: float, direct: dict[str, Any], via: dict[str, Any], duration_s: float, warmup_s: float, pinned: bool,
    cores: list[int], policy: str = "round_robin", stream: bool = True, replicas: int = 1,
) -> dict[str, Any]:  # fmt: skip
    def added(q: str) -> float | None:
        a, b = via["e2e_ms"][q], direct["e2e_ms"][q]
        return None if a is None or b is None else round(a - b, 2)

    return {
        "policy": policy, "workload": "overhead", "rate": rate, "stream": stream,
        "requests": via["requests"], "errors": via["errors"], "error_kinds": via["error_kinds"],
        "reconnects": via["reconnects"],
        "throughput_rps": via["rps"],
        "output_tok_per_s": round(via["rps"] * 8, 1), "ttft_ms": via["e2e_ms"], "e2e_ms": via["e2e_ms"],
        "workflow_e2e_ms": via["e2e_ms"], "sla_attainment": None, "goodput_rps": None, "task_success": None,
        "added_latency_ms": {"p50": added("p50"), "p99": added("p99")},
        "cpu_us_per_request": via.get("cpu_us_per_request"),  # the router's processes, warm-up included
        "direct_rps": direct["rps"], "gateway_rps": via["rps"],
        "throughput_ratio": round(via["rps"] / direct["rps"], 3) if direct["rps"] else None,
        "direct": {"requests": direct["requests"], "errors": direct["errors"], "error_kinds": direct["error_kinds"],
                   "reconnects": direct["reconnects"], "e2e_ms": direct["e2e_ms"]},
        "config": {"workload": "overhead", "rate": rate, "duration_s": duration_s, "warmup_s": warmup_s,
                   "worker": f"chimera_bench.fastworker (8 tokens, {'streamed' if stream else 'one JSON body'})",
                   "client": "raw asyncio HTTP/1.1",
                   "pinning": _pinning(cores, replicas) if pinned else "none",
                   "latency": "scheduled arrival to end of body; ttft_ms = e2e_ms"},
    }  # fmt: skip


def _pinning(cores: list[int], replicas: int) -> str:
    router = f"router on core {cores[0]}" if replicas == 1 else f"chimera on cores {cores[0]}-{cores[replicas - 1]}"
    if len(cores) > replicas + 1:
        return f"{router}; client on core {cores[replicas]}; worker on core {cores[replicas + 1]}"
    return f"{router}; worker and client on core {cores[replicas]}"


def _print(entries: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="router overhead (zero-latency worker)", title_justify="left")
    heads = ("router", "rate", "stream", "direct rps", "via rps", "ratio", "direct p50", "via p50", "added p50",
             "added p99", "cpu us/req", "err")  # fmt: skip
    for h in heads:
        t.add_column(h, justify="right")
    for e in entries:
        t.add_row(e["policy"], f"{e['rate']:g}", "yes" if e.get("stream", True) else "no", str(e["direct_rps"]),
                  str(e["gateway_rps"]), str(e["throughput_ratio"]),
                  str(e["direct"]["e2e_ms"]["p50"]), str(e["e2e_ms"]["p50"]), str(e["added_latency_ms"]["p50"]),
                  str(e["added_latency_ms"]["p99"]), str(e["cpu_us_per_request"]), str(e["errors"]))  # fmt: skip
    Console(width=160).print(t)
