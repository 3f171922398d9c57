"""Benchmark the Redis fleet state: 1 vs 2 gateway replicas, Redis round trips per request, and
reservations leaked after a replica is SIGKILLed mid-load.

    python scripts/bench_state.py --duration 8 --runs 3 --concurrency 32 --out docs/bench_state.json

Every gateway is a separate `chimera serve` process; the worker is a zero-latency fake (a tiny
ASGI app under uvicorn) so the gateways, not the worker, are what is measured. Load is closed-loop
(``--concurrency`` requests always in flight) from this process with httpx, spread round-robin
over the replicas. Redis is the one on 127.0.0.1:6379 (a fresh key prefix per run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

REDIS = "redis://127.0.0.1:6379/0"
COMPLETION = json.dumps({
    "id": "x", "object": "text_completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24},
}).encode()  # fmt: skip


def worker_app(delay_s: float) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path.startswith("/v1/"):
            while (await receive()).get("more_body"):
                pass
            if delay_s:
                await asyncio.sleep(delay_s)
            body, ctype = COMPLETION, b"application/json"
        elif path == "/metrics":
            body, ctype = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n", b"text/plain"
        else:
            body, ctype = b"{}", b"application/json"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def start_worker(procs: list[subprocess.Popen[bytes]], delay_ms: float) -> str:
    port = free_port()
    procs.append(subprocess.Popen([sys.executable, __file__, "_worker", "--port", str(port), "--delay-ms",
                                   str(delay_ms)]))  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_up(url)
    return url


def start_gateways(procs: list[subprocess.Popen[bytes]], n: int, worker: str, state: str, tmp: Path) -> list[str]:
    cfg = {
        "gateway": {"state": state, "policy": "least_outstanding", "default_agent": "chat"},
        "backends": [{"name": "w0", "url": worker, "model": "m", "kv_budget_tokens": 10_000_000}],
        "agents": [{"name": "chat", "models": ["m"]}],
    }
    path = tmp / f"gw-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    urls = []
    for _ in range(n):
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "router.cli", "serve", "--config", str(path),
                                       "--port", str(port)], stderr=subprocess.DEVNULL))  # fmt: skip
        urls.append(f"http://127.0.0.1:{port}")
    for u in urls:
        wait_up(u)
    return urls


async def closed_loop(urls: list[str], concurrency: int, duration: float) -> tuple[int, int, float]:
    """(ok, errors, seconds): ``concurrency`` loops, each bound to a replica round-robin."""
    body = {"model": "m", "prompt": "hello " * 8, "max_tokens": 16}
    ok = errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=10, limits=limits) as client:
        stop_at = time.perf_counter() + duration

        async def loop(url: str) -> None:
            nonlocal ok, errors
            while time.perf_counter() < stop_at:
                try:
                    r = await client.post(url + "/v1/completions", json=body)
                    ok, errors = (ok + 1, errors) if r.status_code == 200 else (ok, errors + 1)
                except httpx.HTTPError:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(loop(urls[i % len(urls)]) for i in range(concurrency)))
        return ok, errors, time.perf_counter() - t0


def round_trips(urls: list[str]) -> float:
    total = 0.0
    for u in urls:
        m = re.search(r"^chimera_state_redis_commands_total (\S+)$", httpx.get(u + "/metrics").text, re.M)
        total += float(m.group(1)) if m else 0.0
    return total


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def throughput(args: argparse.Namespace, replicas: int, state: str, tmp: Path) -> dict[str, Any]:
    with processes() as procs:
        worker = start_worker(procs, 0.0)
        urls = start_gateways(procs, replicas, worker, state, tmp)
        gateways = [p.pid for p in procs[1:]]
        asyncio.run(closed_loop(urls, args.concurrency, 1.0))  # warm up connections and scripts
        rt0, cpu0 = round_trips(urls), cpu_seconds(gateways)
        ok, errors, secs = asyncio.run(closed_loop(urls, args.concurrency, args.duration))
        rt, cpu = round_trips(urls) - rt0, cpu_seconds(gateways) - cpu0
    per_request = rt / ok if ok and state != "memory" else None
    return {"replicas": replicas, "state": state.split("?")[0], "requests": ok, "errors": errors,
            "rps": ok / secs, "redis_round_trips_per_request": per_request,
            "gateway_cpu_ms_per_request": 1000 * cpu / ok if ok else None}  # fmt: skip


def kill_mid_load(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Two replicas over a 50 ms worker; SIGKILL one mid-load; count what it leaves in Redis."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    ttl = 2.0
    state = f"{REDIS}?prefix={prefix}&lease_ttl_s={ttl}"
    client = redis.Redis.from_url(REDIS, decode_responses=True)

    def stored_tokens() -> int:
        return sum(int(v) for k in client.scan_iter(match="{" + prefix + "}:load:*")
                   for f, v in client.hgetall(k).items() if f.endswith(":t"))  # fmt: skip

    try:
        with processes() as procs:
            worker = start_worker(procs, 50.0)
            urls = start_gateways(procs, 2, worker, state, tmp)
            victim = procs[-1]

            async def load_and_kill() -> tuple[int, float]:
                task = asyncio.create_task(closed_loop(urls[:1] + urls, args.concurrency, 3.0))
                await asyncio.sleep(1.5)
                before = stored_tokens()
                os.kill(victim.pid, signal.SIGKILL)
                killed = time.monotonic()
                await task
                return before, killed

            before, killed = asyncio.run(load_and_kill())
            right_after = stored_tokens()
            time.sleep(max(0.0, killed + ttl + 0.5 - time.monotonic()))
            leaked = stored_tokens()
            fleet = httpx.get(urls[0] + "/fleet").json()["backends"][0]
    finally:
        for k in client.scan_iter(match="{" + prefix + "}*"):
            client.delete(k)
        client.close()
    return {"lease_ttl_s": ttl, "tokens_reserved_at_kill": before, "tokens_in_redis_after_load": right_after,
            "tokens_leaked_after_ttl": leaked, "survivor_fleet_inflight_tokens": fleet["inflight_tokens"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="bench", choices=["bench", "_worker"])
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.mode == "_worker":
        import uvicorn

        uvicorn.run(worker_app(args.delay_ms / 1000), host="127.0.0.1", port=args.port, log_level="warning",
                    access_log=False, lifespan="off")  # fmt: skip
        return
    results: dict[str, Any] = {"cpus": os.cpu_count(), "args": {k: v for k, v in vars(args).items() if k != "out"},
                               "runs": []}  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for run in range(args.runs):
            prefix = f"bench-{uuid.uuid4().hex[:8]}"
            rows = [throughput(args, 1, "memory", tmp)]
            rows += [throughput(args, n, f"{REDIS}?prefix={prefix}-{n}", tmp) for n in (1, 2)]
            kill = kill_mid_load(args, tmp)
            results["runs"].append({"run": run, "throughput": rows, "kill": kill})
            for r in rows:
                rt = r["redis_round_trips_per_request"]
                print(f"run {run}: {r['replicas']} x {r['state']:<28} {r['rps']:8.1f} req/s  errors {r['errors']}"
                      f"  gateway CPU {r['gateway_cpu_ms_per_request']:.2f} ms/request"
                      f"  redis round trips/request {'-' if rt is None else f'{rt:.2f}'}")  # fmt: skip
            print(f"run {run}: SIGKILL mid-load: {json.dumps(kill)}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
