#!/usr/bin/env python3
"""Where one request's TTFT goes on a busy worker: the client's TTFT split by vLLM's own per-request timings.

For each decode batch B (0: an idle worker), a child process keeps B streamed requests decoding (prompt 256,
``ignore_eos``, long outputs, cancelled at the end); meanwhile this process sends single requests of L prompt
tokens (``max_tokens`` 1, streamed, fresh random words: no prefix-cache hit), one at a time, and scrapes
``/metrics`` before and after each. While the decoders run, the only new TTFT, queue and prefill observations are
the injected request's, so the deltas of these histograms' sums are that one request's timings:

* ``queue``: ``vllm:request_queue_time_seconds``, from reaching the engine core's queue to being scheduled;
* ``prefill``: ``vllm:request_prefill_time_seconds``, from being scheduled to its first token (the prefill step);
* ``engine_ttft``: ``vllm:time_to_first_token_seconds``, from the API server's arrival stamp to the first token
  handled by its output processor;
* ``client_ttft``: from sending the request to the first chunk, here;
* ``gen_tok_s``: ``vllm:generation_tokens_total``'s growth over the sample's window, per (modelled) second — the
  decoders' own token rate on the probed boot, what loads the API server's streaming work.

So ``client - engine_ttft`` is the front end's intake and the answer's way out, and
``engine_ttft - queue - prefill`` the hand-over between the API server and the engine core, both ways. A sample
whose deltas do not count exactly one request (a decoder finished or started in between) is dropped.

    python scripts/calibrate/split_probe.py --url http://127.0.0.1:8002 --model qwen2.5-1.5b \
        --batches 0,8,32,64 --prompts 128,2048 --reps 8 --out split-1.5b.json

Runs against real vLLM and the sim alike (the sim exposes the same histograms). Standard library and httpx only
(it runs on the lent GPU machine's bare Python too).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_client import make_prompt, run_specs  # next to this file
from probe_stats import parse_metrics  # next to this file

GENERATED = "vllm:generation_tokens_total"
PARTS = {
    "engine_ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
}


def scrape(c: httpx.Client, url: str) -> dict[str, float]:
    return parse_metrics(c.get(url + "/metrics").text)


def running(c: httpx.Client, url: str) -> float:
    return scrape(c, url).get("vllm:num_requests_running", 0.0)


def inject(c: httpx.Client, url: str, model: str, prompt: int, seed: int) -> float | None:
    """One streamed request of ``prompt`` tokens and one output token; the client's TTFT (s), None on error."""
    body = {"model": model, "prompt": make_prompt(prompt, seed), "max_tokens": 1, "ignore_eos": True,
            "temperature": 0.0, "stream": True}  # fmt: skip
    t0 = time.perf_counter()
    with c.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return None
        first = None
        for line in r.iter_lines():
            if first is None and line.startswith("data: ") and line != "data: [DONE]":
                first = time.perf_counter() - t0
    return first


def sample(c: httpx.Client, url: str, model: str, prompt: int, seed: int, scale: float = 1.0) -> dict | None:
    """One injected request's timings (s, times ``scale``: a sim's speedup gives modelled time); None if unusable."""
    m0, t0 = scrape(c, url), time.perf_counter()
    client = inject(c, url, model, prompt, seed)
    m1, t1 = scrape(c, url), time.perf_counter()
    if client is None:
        return None
    out: dict = {"client_ttft": client * scale}
    # the tokens the worker generated meanwhile (the decoders' and this request's one), per modelled second: the rate
    # that loads the API server's streaming work (docs/CALIBRATION.md), measured on the probed boot itself
    gen = m1.get(GENERATED, 0.0) - m0.get(GENERATED, 0.0)
    out["gen_tok_s"] = gen / ((t1 - t0) * scale) if t1 > t0 else 0.0
    for key, name in PARTS.items():
        n = m1.get(name + "_count", 0.0) - m0.get(name + "_count", 0.0)
        if name + "_count" not in m1:
            continue  # a server without this histogram
        if n != 1:
            return None  # another request was counted too
        out[key] = (m1[name + "_sum"] - m0[name + "_sum"]) * scale
    out["running_before"] = m0.get("vllm:num_requests_running", 0.0)
    return out


def summarize(samples: list[dict]) -> dict:
    keys = ["client_ttft", *[k for k in PARTS if all(k in s for s in samples)]]
    med = {k: statistics.median(s[k] for s in samples) * 1e3 for k in keys}
    if all("gen_tok_s" in s for s in samples):
        med["gen_tok_s"] = statistics.median(s["gen_tok_s"] for s in samples)  # tokens per second, not ms
    if "engine_ttft" in med:
        med["front_end"] = statistics.median((s["client_ttft"] - s["engine_ttft"]) * 1e3 for s in samples)
        if "queue" in med and "prefill" in med:
            med["hand_over"] = statistics.median((s["engine_ttft"] - s["queue"] - s["prefill"]) * 1e3 for s in samples)
    return {k: round(v, 2) for k, v in med.items()}


def run_cell_batch(a: argparse.Namespace, c: httpx.Client, batch: int, rng: random.Random) -> list[dict]:
    """Every prompt length's samples with ``batch`` streams decoding (interleaved, so a drift falls on all)."""
    child = None
    if batch:
        stream = bool(a.decode_stream)
        specs = [{"id": i, "prompt": 256, "out": a.decode_out, "stream": stream, "seed": rng.randrange(1 << 30)}
                 for i in range(batch)]  # fmt: skip
        child = mp.get_context("spawn").Process(
            target=run_specs, args=((a.url, a.model, specs, time.perf_counter() + 0.3, 600.0),), daemon=True
        )
        child.start()
        t_end = time.monotonic() + 30
        while running(c, a.url) < batch and time.monotonic() < t_end:
            time.sleep(0.05)
        time.sleep(a.settle / a.speedup)
    cells: dict[int, list[dict]] = {p: [] for p in a.prompts}
    for _ in range(a.reps):
        for p in a.prompts:
            s = sample(c, a.url, a.model, p, rng.randrange(1 << 30), a.speedup)
            if s is not None and (not batch or s["running_before"] >= batch):
                cells[p].append(s)
            time.sleep((a.gap + rng.random() * a.gap) / a.speedup)  # a random phase against the engine's steps
    if child is not None:
        child.terminate()  # its connections close; vLLM aborts the decoders
        child.join(10)
        t_end = time.monotonic() + 30
        while running(c, a.url) > 0 and time.monotonic() < t_end:
            time.sleep(0.1)
    return [{"batch": batch, "prompt": p, "n": len(v), "median_ms": summarize(v) if v else {}, "samples": v}
            for p, v in cells.items()]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batches", default="0,8,32,64")
    ap.add_argument("--prompts", default="128,2048")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--decode-out", type=int, default=3000, help="the decoders' output length (cancelled at the end)")
    ap.add_argument(
        "--decode-stream", type=int, default=1, help="1: the decoders stream (SSE per token); 0: they do not"
    )
    ap.add_argument("--settle", type=float, default=0.4, help="seconds after the decoders are running")
    ap.add_argument("--gap", type=float, default=0.1, help="pause between samples: gap + U(0, gap) s")
    ap.add_argument(
        "--seed", type=int, default=None, help="prompt seed (default: from the clock, so a rerun on the same "
        "workers finds no prompt of the last one in their prefix caches; the 2026-11-30 boot-2 run used 0 twice)"
    )  # fmt: skip
    ap.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="a sim's --speedup: its wall times are scaled by it to modelled time (pauses divided by it)",
    )
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    a.prompts = [int(x) for x in a.prompts.split(",") if x]
    if a.seed is None:
        a.seed = time.time_ns() % (1 << 31)
    rng = random.Random(a.seed)
    cells = []
    with httpx.Client(timeout=120.0) as c:
        inject(c, a.url, a.model, 16, rng.randrange(1 << 30))  # warm the connection and the server
        for b in (int(x) for x in a.batches.split(",") if x):
            for cell in run_cell_batch(a, c, b, rng):
                cells.append(cell)
                print(f"{a.model} batch {b:3d} prompt {cell['prompt']:5d} n={cell['n']:2d} {cell['median_ms']}",
                      flush=True)  # fmt: skip
    meta = {
        "url": a.url,
        "model": a.model,
        "reps": a.reps,
        "decode_out": a.decode_out,
        "decode_stream": a.decode_stream,
        "seed": a.seed,
        "speedup": a.speedup,
        "date": time.strftime("%F %T"),
    }
    Path(a.out).write_text(json.dumps({"meta": meta, "cells": cells}, indent=1) + "\n")


if __name__ == "__main__":
    main()
