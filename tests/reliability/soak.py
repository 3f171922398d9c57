"""Soak: a bounded run of the gateway at a fixed share of its capacity, watching its process.

Starts ``chimera serve`` (which starts its simulated workers) on a generated config, measures the
fleet's capacity with a short closed loop at high concurrency (this doubles as the warm-up), then
sends an open-loop Poisson load at ``--load`` x that rate for ``--duration`` seconds. Every
``--sample-s`` it reads the gateway process's resident memory (VmRSS) and open file descriptors
from /proc (psutil is not needed). Prints one JSON object and writes it to ``--out`` if given:

    python -m tests.reliability.soak --duration 300 --load 0.7 --out soak.json

(from the repository root; ``tests/reliability/test_soak.py`` runs a short one with the suite).

``rss_growth_pct`` compares the median RSS of the last fifth of the run with the first fifth
(after the warm-up); the target is < 5 %. ``fds_growth`` does the same for descriptors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2 as httpx  # the leaner pool: the load generator must outpace the gateway
import yaml

from backends.listen import free_port, wait_ready
from backends.transport import WORKER_KEEPALIVE_S

# the gateway keeps idle connections to its workers WORKER_KEEPALIVE_S: descriptors are counted at rest only after
# those have expired, so that the pool a busier moment opened is not taken for a leak
REST_S = WORKER_KEEPALIVE_S + 1.5

ROOT = Path(__file__).resolve().parents[2]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def write_config(folder: Path, sims: int, speedup: float) -> tuple[Path, str]:
    port = free_port()
    backends = [
        {"name": f"sim-{i}", "url": f"http://127.0.0.1:{free_port()}", "model": "qwen2.5-0.5b",
         "kv_budget_tokens": 200_000, "sim": {"profile": "h200-qwen2.5-0.5b", "speedup": speedup, "seed": i}}
        for i in range(sims)
    ]  # fmt: skip
    config = {
        "gateway": {"host": "127.0.0.1", "port": port, "policy": "least_outstanding", "default_agent": "chat",
                    "request_log": str(folder / "requests.jsonl")},
        "backends": backends,
        "agents": [{"name": "chat", "models": ["qwen2.5-0.5b"]}],
    }  # fmt: skip
    path = folder / "soak.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, f"http://127.0.0.1:{port}"


def body(rng: random.Random) -> dict[str, Any]:
    n = rng.randint(8, 48)
    words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega"]) for _ in range(rng.randint(5, 200)))
    return {"model": "auto", "stream": rng.random() < 0.5, "max_tokens": n, "sim": {"output_tokens": n},
            "messages": [{"role": "user", "content": words}]}  # fmt: skip


class Counts:
    def __init__(self) -> None:
        self.ok = 0
        self.errors = 0
        self.error_kinds: Counter[str] = Counter()  # status code or exception name
        self.latencies: list[float] = []


async def send(client: httpx.AsyncClient, url: str, rng: random.Random, counts: Counts) -> None:
    b = body(rng)
    t0 = time.perf_counter()
    try:
        if b["stream"]:
            async with client.stream("POST", url + "/v1/chat/completions", json=b) as r:
                text = await r.aread()
            ok = r.status_code == 200 and text.endswith(b"data: [DONE]\n\n")
            kind = str(r.status_code) if r.status_code != 200 else "stream ended without [DONE]"
        else:
            r = await client.post(url + "/v1/chat/completions", json=b)
            ok, kind = r.status_code == 200, str(r.status_code)
    except httpx.HTTPError as exc:
        ok, kind = False, type(exc).__name__
    counts.latencies.append(time.perf_counter() - t0)
    if ok:
        counts.ok += 1
    else:
        counts.errors += 1
        counts.error_kinds[kind] += 1


async def calibrate(url: str, seconds: float, concurrency: int) -> float:
    """Requests per second the fleet completes with ``concurrency`` always in flight."""
    counts, rng = Counts(), random.Random(1)
    deadline = time.monotonic() + seconds

    async def lane(client: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            await send(client, url, rng, counts)

    async with httpx.AsyncClient(timeout=60) as client:
        t0 = time.monotonic()
        await asyncio.gather(*(lane(client) for _ in range(concurrency)))
        return counts.ok / (time.monotonic() - t0)


async def soak(url: str, pid: int, rate: float, seconds: float, sample_s: float) -> dict[str, Any]:
    counts, rng = Counts(), random.Random(2)
    samples: list[dict[str, float]] = []
    tasks: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    await asyncio.sleep(REST_S)  # the calibration's connections are closed: a baseline at rest
    fds_idle_before = open_fds(pid)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        t0 = time.monotonic()
        next_sample = t0
        next_send = t0
        while (now := time.monotonic()) < t0 + seconds:
            if now >= next_sample:
                samples.append({"t": round(now - t0, 2), "rss": rss_bytes(pid), "fds": open_fds(pid),
                                "inflight": len(tasks)})  # fmt: skip
                next_sample += sample_s
            if now >= next_send:
                task = asyncio.create_task(send(client, url, rng, counts))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_send += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, min(next_send, next_sample) - time.monotonic()))
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - t0
    await asyncio.sleep(REST_S)
    samples.append({"t": round(elapsed, 2), "rss": rss_bytes(pid), "fds": open_fds(pid), "inflight": 0})
    idle = {"before": fds_idle_before, "after": open_fds(pid)}
    return {"counts": counts, "samples": samples, "elapsed": elapsed, "fds_idle": idle}


def _median_of(samples: list[dict[str, float]], key: str, part: slice) -> float:
    return float(statistics.median(s[key] for s in samples[part]))


def summarize(run: dict[str, Any], rate: float, capacity: float, args: argparse.Namespace) -> dict[str, Any]:
    samples, counts = run["samples"], run["counts"]
    fifth = max(1, len(samples) // 5)
    rss0, rss1 = _median_of(samples, "rss", slice(0, fifth)), _median_of(samples, "rss", slice(-fifth, None))
    fds0, fds1 = _median_of(samples, "fds", slice(0, fifth)), _median_of(samples, "fds", slice(-fifth, None))
    lat = sorted(counts.latencies) or [0.0]
    return {
        "command": "python -m tests.reliability.soak " + " ".join(sys.argv[1:]),
        "duration_s": round(run["elapsed"], 1),
        "sims": args.sims, "speedup": args.speedup, "load": args.load,
        "capacity_rps": round(capacity, 1), "target_rps": round(rate, 1),
        "achieved_rps": round((counts.ok + counts.errors) / run["elapsed"], 1),
        "requests": counts.ok + counts.errors, "errors": counts.errors, "error_kinds": dict(counts.error_kinds),
        "latency_ms": {"p50": round(lat[len(lat) // 2] * 1000, 1), "p99": round(lat[int(len(lat) * 0.99)] * 1000, 1)},
        "rss_mib_start": round(rss0 / 2**20, 1), "rss_mib_end": round(rss1 / 2**20, 1),
        "rss_mib_max": round(max(s["rss"] for s in samples) / 2**20, 1),
        "rss_growth_pct": round((rss1 - rss0) / rss0 * 100, 2),
        "fds_start": fds0, "fds_end": fds1, "fds_max": max(s["fds"] for s in samples), "fds_growth": fds1 - fds0,
        "fds_idle_before": run["fds_idle"]["before"], "fds_idle_after": run["fds_idle"]["after"],
        "samples": len(samples),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=120.0, help="soak seconds (after calibration)")
    p.add_argument("--load", type=float, default=0.7, help="share of the measured capacity")
    p.add_argument("--sims", type=int, default=2)
    p.add_argument("--speedup", type=float, default=4.0)
    p.add_argument("--calibrate-s", type=float, default=8.0)
    p.add_argument("--concurrency", type=int, default=48, help="closed-loop concurrency of the calibration")
    p.add_argument("--sample-s", type=float, default=1.0)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="chimera-soak-") as tmp:
        config, url = write_config(Path(tmp), args.sims, args.speedup)
        cmd = [sys.executable, "-m", "router.cli", "serve", "--config", str(config)]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(url + "/ready", 60, proc=proc)
            capacity = asyncio.run(calibrate(url, args.calibrate_s, args.concurrency))
            rate = capacity * args.load
            run = asyncio.run(soak(url, proc.pid, rate, args.duration, args.sample_s))
        finally:
            # SIGINT, not SIGTERM: uvicorn re-raises the signal it caught after its graceful shutdown,
            # and a re-raised SIGTERM ends `chimera serve` before it stops its simulated workers.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    result = summarize(run, rate, capacity, args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
