#!/usr/bin/env python
"""Capacity of one simulated vLLM worker process: sustained streamed tokens/s and engine lag.

Starts ``backends.sim`` pinned to one core (``taskset -c SIM_CPU``) and keeps ``--concurrency``
streaming completions in flight (closed loop, staggered starts, output lengths drawn 0.5x-1.5x
``--output-tokens``) from ``--client-procs`` httpx client processes pinned to other cores. After
``--warmup`` seconds it measures for ``--duration`` seconds: client-side output tokens/s, the sim's
CPU use, and the engine's lag against its own schedule (``sim:engine_step_lag_seconds``).

    python scripts/sim_capacity.py --concurrency 512 --profile h200-qwen2.5-7b --speedup 0.1,0.2

The engine keeps up when the lag stays at timer resolution (about 1 ms); a growing lag means the
process cannot deliver the tokens the simulated GPU produces.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
LAG_RE = re.compile(r'^sim:engine_step_lag_seconds_(bucket|sum|count)\{(?:le="([^"]+)",)?[^}]*\} (\S+)$')


def scrape(base: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith("#"):
            continue
        m = LAG_RE.match(line)
        if m:
            out[f"lag_{m.group(1)}_{m.group(2) or ''}"] = float(m.group(3))
        elif line.startswith(("sim:", "vllm:num_", "vllm:generation_tokens_total", "vllm:kv_cache")):
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
    return out


def lag_quantile(before: dict[str, float], after: dict[str, float], q: float) -> float:
    buckets = sorted(
        (float(k.rsplit("_", 1)[1]), after[k] - before.get(k, 0.0)) for k in after if k.startswith("lag_bucket_")
    )
    total = buckets[-1][1] if buckets else 0.0
    for bound, cum in buckets:
        if cum >= q * total:
            return bound
    return float("inf")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_proc(cfg: dict[str, Any], workers: range, cpu: int | None, out: mp.Queue[int]) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    out.put(asyncio.run(drive(cfg, workers)))


async def drive(cfg: dict[str, Any], workers: range) -> int:
    """Stream until the measurement ends; return the tokens received during the measurement."""
    tokens = 0
    n_conn = len(workers) + 8
    limits = httpx.Limits(max_connections=n_conn, max_keepalive_connections=n_conn)

    async def worker(k: int, client: httpx.AsyncClient) -> None:
        nonlocal tokens
        rng = random.Random(k)
        await asyncio.sleep(rng.uniform(0, cfg["warmup"] / 2))  # stagger, so steps do not come in waves
        n = 0
        while True:
            n += 1
            out = rng.randint(cfg["output_tokens"] // 2, cfg["output_tokens"] * 3 // 2)
            body = {
                "model": cfg["model"],
                "prompt": f"worker {k} request {n} " + "lorem " * cfg["prompt_words"],
                "max_tokens": out,
                "stream": True,
                "sim": {"output_tokens": out},
            }
            async with client.stream("POST", f"{cfg['base']}/v1/completions", json=body) as resp:
                async for chunk in resp.aiter_raw():
                    tokens += chunk.count(b'"text":"')

    async def raw_worker(k: int, _client: httpx.AsyncClient) -> None:
        """The same requests over a bare asyncio stream: a client cheap enough not to be the bottleneck."""
        nonlocal tokens
        rng = random.Random(k)
        await asyncio.sleep(rng.uniform(0, cfg["warmup"] / 2))
        host, port = cfg["base"].removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        n = 0
        try:
            while True:
                n += 1
                out = rng.randint(cfg["output_tokens"] // 2, cfg["output_tokens"] * 3 // 2)
                body = json.dumps({
                    "model": cfg["model"],
                    "prompt": f"worker {k} request {n} " + "lorem " * cfg["prompt_words"],
                    "max_tokens": out,
                    "stream": True,
                    "sim": {"output_tokens": out},
                }).encode()  # fmt: skip
                head = f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                writer.write(head.encode() + b"content-length: %d\r\n\r\n" % len(body) + body)
                tail = b""
                while not tail.endswith(b"0\r\n\r\n"):  # the chunked body's last chunk
                    data = await reader.read(65536)
                    if not data:
                        raise ConnectionError("the simulator closed the connection")
                    tokens += data.count(b'"text":"')
                    tail = (tail + data)[-16:]
        finally:
            writer.close()

    run = raw_worker if cfg["client"] == "raw" else worker
    async with httpx.AsyncClient(limits=limits, timeout=300) as client:
        tasks = [asyncio.create_task(run(k, client)) for k in workers]
        await asyncio.sleep(cfg["t0"] - time.time())
        start = tokens
        await asyncio.sleep(cfg["t1"] - time.time())
        got = tokens - start
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return got


def run_one(args: argparse.Namespace, speedup: float) -> dict[str, Any] | None:
    code = (
        "from backends.sim.server import SimSettings, serve; "
        f"serve(SimSettings(profile={args.profile!r}, speedup={speedup!r}), '127.0.0.1', {args.port})"
    )
    cmd = [sys.executable, "-c", code]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", str(args.sim_cpu), *cmd]
    sim = subprocess.Popen(cmd, cwd=ROOT)
    base = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(100):
            try:
                model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
                break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            print("the simulator did not start", file=sys.stderr)
            return None
        t0 = time.time() + 1.0 + args.warmup
        cfg = {**vars(args), "model": model, "base": base, "t0": t0, "t1": t0 + args.duration}
        cpus = [int(c) for c in args.client_cpus.split(",")] if args.client_cpus else [None]
        queue: mp.Queue[int] = mp.Queue()
        procs = [
            mp.Process(target=client_proc, args=(cfg, range(i, args.concurrency, args.client_procs),
                                                 cpus[i % len(cpus)], queue))
            for i in range(args.client_procs)
        ]  # fmt: skip
        for p in procs:
            p.start()
        time.sleep(max(0.0, t0 - time.time()))
        m0, cpu0 = scrape(base), cpu_seconds(sim.pid)
        time.sleep(max(0.0, t0 + args.duration / 2 - time.time()))
        mid = scrape(base)
        time.sleep(max(0.0, t0 + args.duration - time.time()))
        m1, cpu1 = scrape(base), cpu_seconds(sim.pid)
        tokens = sum(queue.get(timeout=120) for _ in procs)
        for p in procs:
            p.join()
    finally:
        sim.terminate()
        sim.wait()
    wall = args.duration
    steps = m1["sim:engine_steps_total"] - m0["sim:engine_steps_total"]
    busy = m1["sim:engine_busy_seconds_total"] - m0["sim:engine_busy_seconds_total"]
    return {
        "profile": args.profile,
        "speedup": speedup,
        "concurrency": args.concurrency,
        "client": f"{args.client} x{args.client_procs}",
        "client_output_tok_per_s": round(tokens / wall),
        "engine_output_tok_per_s": round(
            (m1["vllm:generation_tokens_total"] - m0["vllm:generation_tokens_total"]) / wall
        ),
        "running_mid": mid["vllm:num_requests_running"],
        "waiting_mid": mid["vllm:num_requests_waiting"],
        "steps_per_s": round(steps / wall, 1),
        "engine_busy_share": round(busy / wall, 3),
        "sim_cpu_share": round((cpu1 - cpu0) / wall, 3),
        "lag_mean_ms": round(1e3 * (m1["lag_sum_"] - m0["lag_sum_"]) / max(steps, 1), 3),
        "lag_p50_ms_at_most": 1e3 * lag_quantile(m0, m1, 0.5),
        "lag_p99_ms_at_most": 1e3 * lag_quantile(m0, m1, 0.99),
        "lag_end_ms": round(1e3 * m1["sim:engine_lag_seconds"], 3),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=512)
    p.add_argument("--profile", default="h200-qwen2.5-7b")
    p.add_argument("--speedup", default="0.1", help="comma-separated: one run per value")
    p.add_argument("--output-tokens", type=int, default=256, help="mean; each request draws 0.5x-1.5x")
    p.add_argument("--prompt-words", type=int, default=64)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=6.0)
    p.add_argument("--port", type=int, default=18123)
    p.add_argument("--sim-cpu", type=int, default=0)
    p.add_argument("--client-procs", type=int, default=1)
    p.add_argument("--client", choices=("httpx", "raw"), default="httpx", help="raw: bare asyncio streams")
    p.add_argument("--client-cpus", default="1", help="comma-separated cores for the client processes")
    args = p.parse_args()
    results = []
    for speedup in args.speedup.split(","):
        result = run_one(args, float(speedup))
        if result is None:
            return 1
        results.append(result)
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
