#!/usr/bin/env python3
"""TTFT of chat against plain completions, and of a proxied path against a direct one, from the client side.

The profiles' TTFT constants were fitted on ``/v1/completions`` probes (``probe.py``), while the bench's agents
send ``/v1/chat/completions``: the chat path of vLLM's API server renders the chat template and parses the
conversation first. This probe measures what that costs, and what a hop in front of a worker costs (the
sim-fields proxy of the real runs, ``backends/simfields.py``), on idle workers: one request at a time, each
with a fresh random prompt (no prefix-cache hit), ``max_tokens`` 2 and ``ignore_eos``, TTFT = time to the first
chunk carrying text. Requests carry the bench's ``sim`` field, so a proxy takes the path it takes in a bench run
(the 2026-11-30 run's did not: through the proxy they were passed on untouched). The cells (target x endpoint
x prompt length) are interleaved round by round, so a drift of the machine's speed falls on all of them alike.

    python scripts/calibrate/chat_probe.py --model qwen2.5-1.5b --target direct=http://127.0.0.1:8002 \
        --target proxy=http://127.0.0.1:9002 --out chat-1.5b.json

Only the standard library and httpx are needed (it runs on the lent GPU machine's bare Python too).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_client import make_prompt  # next to this file

ENDPOINTS = ("completions", "chat")


def one(client: httpx.Client, url: str, model: str, endpoint: str, prompt: str) -> tuple[float, int | None]:
    """(client TTFT in seconds, prompt tokens the server counted) of one streamed request."""
    body: dict = {"model": model, "max_tokens": 2, "ignore_eos": True, "temperature": 0.0, "stream": True,
                  "stream_options": {"include_usage": True},
                  # what the bench sends: a proxy then rewrites the request and patches the answer's events, as in
                  # a bench run (a vLLM ignores the field; a sim answers the same 2 tokens)
                  "sim": {"output_tokens": 2, "difficulty": 0.5}}  # fmt: skip
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    t0 = time.perf_counter()
    ttft, prompt_tokens = None, None
    with client.stream("POST", url + path, json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") if endpoint == "chat" else choice.get("text")
                if text and ttft is None:
                    ttft = time.perf_counter() - t0
            if event.get("usage"):
                prompt_tokens = event["usage"].get("prompt_tokens")
    if ttft is None:
        raise RuntimeError(f"{url}{path}: no text came back")
    return ttft, prompt_tokens


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--target", action="append", required=True, help="NAME=URL (repeat)")
    ap.add_argument("--prompts", default="128,1024,4096", help="prompt lengths in words")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    targets = dict(t.split("=", 1) for t in a.target)
    prompts = [int(p) for p in a.prompts.split(",")]
    cells = [(t, e, p) for t in targets for e in ENDPOINTS for p in prompts]
    samples: dict[tuple[str, str, int], list[float]] = {c: [] for c in cells}
    tokens: dict[tuple[str, str, int], int | None] = {}
    rng = random.Random(a.seed)
    with httpx.Client(timeout=60.0) as client:
        for c in cells:  # warm-up: a connection per target, each endpoint's path once
            one(client, targets[c[0]], a.model, c[1], make_prompt(c[2], rng.randrange(1 << 30)))
        for _ in range(a.reps):
            order = cells[:]
            rng.shuffle(order)
            for c in order:
                ttft, n = one(client, targets[c[0]], a.model, c[1], make_prompt(c[2], rng.randrange(1 << 30)))
                samples[c].append(ttft)
                tokens[c] = n
    rows = [
        {"target": t, "endpoint": e, "prompt_words": p, "prompt_tokens": tokens.get((t, e, p)),
         "ttft_ms_p50": 1e3 * statistics.median(samples[(t, e, p)]),
         "ttft_ms_all": [round(1e3 * x, 3) for x in samples[(t, e, p)]]}
        for t, e, p in cells
    ]  # fmt: skip
    Path(a.out).write_text(json.dumps({"model": a.model, "targets": targets, "reps": a.reps, "rows": rows}, indent=1))
    for r in rows:
        print(f"{a.model} {r['target']:>8} {r['endpoint']:>11} p{r['prompt_words']:<5} "
              f"tokens {r['prompt_tokens']}  TTFT p50 {r['ttft_ms_p50']:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
