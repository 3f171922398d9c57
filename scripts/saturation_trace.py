"""Drive one worker (real vLLM or the sim) near and past saturation and record what it does.

The same seeded open-loop stream goes to each worker: Poisson arrivals at each rate, streamed completions whose
prompts are token ids (exact lengths on any tokenizer, no shared prefixes) and whose answers run to ``max_tokens``
(``ignore_eos``). Per request: arrival, prompt and answer length, TTFT and e2e from the scheduled arrival. Every
0.25 s: the worker's running, waiting, KV use and preemption counter from ``/metrics``. One JSON file per worker.

    python scripts/saturation_trace.py --url http://127.0.0.1:8003 --model qwen2.5-7b \\
        --rates 16,24,32 --duration 30 --out real-7b.json

Compare two traces with ``--compare a.json b.json``. ``--burst 256,128,256`` sends one closed burst instead (256
requests of 128 prompt tokens and 256 answer tokens at once, non-streamed, then streamed) and records its makespan and
preemptions: the saturation phase of the probes behind the shipped profiles (``docs/results/real-h200/probes``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time
from typing import Any

import aiohttp

from backends.scrape import parse_metrics
from chimera_bench.stats import quantiles
from router.core.errors import WorkerProtocolError


def requests_for(rate: float, duration: float, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(f"{seed}-{rate}")
    out: list[dict[str, Any]] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        prompt = int(min(4000, max(64, rng.lognormvariate(math.log(800), 0.6))))
        out.append({"at": t, "prompt": prompt, "max_tokens": rng.randint(64, 512),
                    "ids": [rng.randrange(10, 20000) for _ in range(prompt)]})  # fmt: skip


async def one(session: aiohttp.ClientSession, url: str, model: str, req: dict[str, Any], t0: float,
              rec: dict[str, Any], stream: bool = True) -> None:  # fmt: skip
    await asyncio.sleep(max(0.0, t0 + req["at"] - time.monotonic()))
    body = {"model": model, "prompt": req["ids"], "max_tokens": req["max_tokens"], "ignore_eos": True,
            "stream": stream, "temperature": 0}  # fmt: skip
    start = t0 + req["at"]
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                rec["error"] = f"{resp.status}: {(await resp.text())[:200]}"
                return
            async for line in resp.content:
                if line.startswith(b"data: {") and "ttft_s" not in rec:
                    rec["ttft_s"] = time.monotonic() - start
            rec["e2e_s"] = time.monotonic() - start
    except (TimeoutError, aiohttp.ClientError) as exc:
        rec["error"] = repr(exc)


async def sample(session: aiohttp.ClientSession, url: str, t0: float, into: list[dict[str, float]]) -> None:
    while True:
        try:
            async with session.get(url + "/metrics") as resp:
                text = await resp.text()
            m = parse_metrics(text)
            row = {"t": round(time.monotonic() - t0, 3), "running": m.running, "waiting": m.waiting,
                   "kv": m.kv_usage, "preemptions": m.preemptions_total}  # fmt: skip
            into.append({k: v for k, v in row.items() if v is not None})
        except (aiohttp.ClientError, WorkerProtocolError):
            pass
        await asyncio.sleep(0.25)


async def run_rate(url: str, model: str, rate: float, duration: float, drain: float, seed: int) -> dict[str, Any]:
    reqs = requests_for(rate, duration, seed)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        samples: list[dict[str, float]] = []
        t0 = time.monotonic()
        sampler = asyncio.create_task(sample(session, url, t0, samples))
        recs = [{"at": r["at"], "prompt": r["prompt"], "max_tokens": r["max_tokens"]} for r in reqs]
        tasks = [asyncio.create_task(one(session, url, model, r, t0, rec)) for r, rec in zip(reqs, recs, strict=True)]
        _, pending = await asyncio.wait(tasks, timeout=duration + drain)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.sleep(0.5)
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    for rec in recs:
        if "e2e_s" not in rec and "error" not in rec:
            rec["error"] = "unfinished"
    return {"rate": rate, "duration_s": duration, "seed": seed, "requests": recs, "samples": samples,
            "summary": summarize(recs, samples)}  # fmt: skip


def summarize(recs: list[dict[str, Any]], samples: list[dict[str, float]]) -> dict[str, Any]:
    ttft = quantiles(r["ttft_s"] * 1000 for r in recs if "ttft_s" in r)
    e2e = quantiles(r["e2e_s"] * 1000 for r in recs if "e2e_s" in r)
    pre = [s["preemptions"] for s in samples if "preemptions" in s]
    return {
        "requests": len(recs), "errors": sum("error" in r for r in recs),
        "ttft_ms": ttft, "e2e_ms": e2e,
        "preemptions": (max(pre) - min(pre)) if pre else None,
        "waiting_max": max((s.get("waiting", 0) for s in samples), default=None),
        "waiting_mean": round(statistics.fmean(s.get("waiting", 0) for s in samples), 1) if samples else None,
        "running_max": max((s.get("running", 0) for s in samples), default=None),
        "kv_max": max((s.get("kv", 0) for s in samples), default=None),
    }  # fmt: skip


async def main_async(args: argparse.Namespace) -> None:
    out = {"url": args.url, "model": args.model, "runs": []}
    async with aiohttp.ClientSession() as s:  # warm-up: one short request
        await one(s, args.url, args.model, {"at": 0, "ids": [11] * 16, "max_tokens": 4}, time.monotonic(), {})
    for rate in args.rates:
        run = await run_rate(args.url, args.model, rate, args.duration, args.drain, args.seed)
        out["runs"].append(run)
        print(json.dumps({"rate": rate, **run["summary"]}), flush=True)
        await asyncio.to_thread(_write, args.out, out)
        await asyncio.sleep(args.pause)


async def preemptions(session: aiohttp.ClientSession, url: str) -> float | None:
    async with session.get(url + "/metrics") as resp:
        return parse_metrics(await resp.text()).preemptions_total


async def burst(args: argparse.Namespace) -> None:
    """One closed burst, non-streamed then streamed: every request sent at once, timed to the last answer."""
    n, prompt, out_tokens = args.burst
    rng = random.Random(args.seed)
    out: dict[str, Any] = {"url": args.url, "model": args.model, "burst": {"requests": n, "prompt": prompt,
                                                                           "out": out_tokens}}  # fmt: skip
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None)) as s:  # fmt: skip
        await one(s, args.url, args.model, {"at": 0, "ids": [11] * 16, "max_tokens": 4}, time.monotonic(), {})
        for mode in ("nonstream", "stream"):
            reqs = [{"at": 0.0, "max_tokens": out_tokens, "ids": [rng.randrange(10, 20000) for _ in range(prompt)]}
                    for _ in range(n)]  # fmt: skip
            recs: list[dict[str, Any]] = [{} for _ in reqs]
            before = await preemptions(s, args.url)
            t0 = time.monotonic()
            await asyncio.gather(*(one(s, args.url, args.model, r, t0, rec, stream=mode == "stream")
                                   for r, rec in zip(reqs, recs, strict=True)))  # fmt: skip
            makespan = time.monotonic() - t0
            after = await preemptions(s, args.url)
            e2e = quantiles(r["e2e_s"] * 1000 for r in recs if "e2e_s" in r)
            out[mode] = {"makespan_s": round(makespan, 4), "out_tok_s": round(n * out_tokens / makespan, 1),
                         "e2e_ms_p50": e2e["p50"], "e2e_ms_p99": e2e["p99"], "errors": sum("error" in r for r in recs),
                         "preemptions": None if after is None or before is None else after - before}  # fmt: skip
            print(json.dumps({mode: out[mode]}), flush=True)
            await asyncio.sleep(args.pause)
    _write(args.out, out)


def _write(path: str, doc: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(doc, f)


def compare(paths: list[str]) -> None:
    docs = [json.load(open(p)) for p in paths]
    head = "TTFT p50/p99, e2e p50, decode ms/token p50, preempt, waiting max, running max, KV max"
    print("rate | " + " | ".join(f"{p}: {head}" for p in paths))
    for i, run in enumerate(docs[0]["runs"]):
        cells = []
        for d in docs:
            s = d["runs"][i]["summary"]
            per_token = quantiles((r["e2e_s"] - r["ttft_s"]) * 1000 / (r["max_tokens"] - 1)
                                  for r in d["runs"][i]["requests"] if "e2e_s" in r and "ttft_s" in r)  # fmt: skip
            cells.append(f"{s['ttft_ms']['p50']}/{s['ttft_ms']['p99']} ms, {s['e2e_ms']['p50']} ms, "
                         f"{per_token['p50']} ms, {s['preemptions']}, {s['waiting_max']}, {s['running_max']}, "
                         f"{s['kv_max']:.2f} (err {s['errors']})")  # fmt: skip
        print(f"{run['rate']} | " + " | ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--model")
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[16.0, 24.0, 32.0])
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--drain", type=float, default=30.0)
    ap.add_argument("--pause", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="trace.json")
    ap.add_argument("--compare", nargs="+")
    ap.add_argument("--burst", metavar="N,PROMPT,OUT", type=lambda s: [int(x) for x in s.split(",")],
                    help="one closed burst instead of the sweep (the probes' saturation: 256,128,256)")  # fmt: skip
    args = ap.parse_args()
    if args.burst is not None and len(args.burst) != 3:
        ap.error("--burst takes N,PROMPT,OUT")
    if args.compare:
        compare(args.compare)
    elif args.burst:
        asyncio.run(burst(args))
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
