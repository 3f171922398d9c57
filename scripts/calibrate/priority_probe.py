#!/usr/bin/env python3
"""Does a worker serve its waiting queue by request priority? The same probe for real vLLM and the sim.

A worker started with ``--max-num-seqs 1`` runs one sequence at a time. The probe sends a long ``head``
request (priority 9), waits until it runs, queues ``--batch`` short requests (priority 9) behind it, waits
until vLLM reports them waiting, then sends one ``urgent`` request (priority 0), and records the order in
which the answers finish. Under ``--scheduling-policy priority`` the urgent request finishes second (right
after the head); in arrival order (``fcfs``) it finishes last. ``--no-priority`` sends no ``priority`` field
(for an ``fcfs`` worker) and first records what such a worker answers to one (vLLM 0.26: 200, the field ignored).

    python scripts/calibrate/priority_probe.py --url http://127.0.0.1:8001 --model qwen2.5-0.5b --out prio.json

Only the standard library and httpx are needed (it runs on the lent GPU machine's bare Python too).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_client import make_prompt  # next to this file
from probe_stats import parse_metrics  # next to this file


def until(client: httpx.Client, url: str, name: str, value: float, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while parse_metrics(client.get(url + "/metrics").text).get(name, 0.0) < value:
        if time.monotonic() > deadline:
            raise SystemExit(f"{name} never reached {value} on {url}")
        time.sleep(0.005)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=5)
    ap.add_argument("--head-tokens", type=int, default=600, help="the head request's answer (holds the engine)")
    ap.add_argument("--no-priority", action="store_true", help="send no priority field (an fcfs worker)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rng = random.Random(time.time_ns())
    finished: list[dict[str, Any]] = []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def one(tag: str, priority: int, out: int) -> None:
        body: dict[str, Any] = {"model": args.model, "max_tokens": out, "ignore_eos": True, "temperature": 0.0,
                                "prompt": make_prompt(16, rng.getrandbits(32))}  # fmt: skip
        if not args.no_priority:
            body["priority"] = priority
        sent = time.perf_counter() - t0
        r = httpx.post(args.url + "/v1/completions", json=body, timeout=120)
        with lock:
            finished.append({"tag": tag, "priority": priority, "status": r.status_code, "sent_s": round(sent, 4),
                             "done_s": round(time.perf_counter() - t0, 4)})  # fmt: skip

    with httpx.Client(timeout=10) as client:
        refused = None
        if args.no_priority:  # what an fcfs worker says to a priority (vLLM 0.26: 200)
            r = client.post(args.url + "/v1/completions", json={"model": args.model, "prompt": "w1 w2", "max_tokens": 1,
                                                                "priority": 3})  # fmt: skip
            refused = {"status": r.status_code, "body": r.text[:300]}
        threads = [threading.Thread(target=one, args=("head", 9, args.head_tokens))]
        threads[0].start()
        until(client, args.url, "vllm:num_requests_running", 1)
        for k in range(args.batch):
            threads.append(threading.Thread(target=one, args=(f"b{k}", 9, 8)))
            threads[-1].start()
        until(client, args.url, "vllm:num_requests_waiting", args.batch)
        threads.append(threading.Thread(target=one, args=("urgent", 0, 8)))
        threads[-1].start()
        until(client, args.url, "vllm:num_requests_waiting", args.batch + 1)
        for t in threads:
            t.join()
    order = [f["tag"] for f in sorted(finished, key=lambda f: f["done_s"])]
    result = {"url": args.url, "model": args.model, "priority_sent": not args.no_priority, "order": order,
              "urgent_position": order.index("urgent") + 1, "requests": finished, "fcfs_answer": refused}  # fmt: skip
    print(json.dumps({k: result[k] for k in ("model", "priority_sent", "order", "urgent_position", "fcfs_answer")}))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    sys.exit(0 if all(f["status"] == 200 for f in finished) else 1)


if __name__ == "__main__":
    main()
