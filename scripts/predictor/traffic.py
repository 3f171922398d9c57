"""Drive the bench's multi-agent workflows through a gateway and write its request log (+ feedback).

    python scripts/predictor/traffic.py --config scripts/predictor/fleet.yaml --policy round_robin \
        --log logs/pred-train.jsonl --seed 1 --duration 300 --rates 0.1,0.3,0.6,0.9 --phase 30

Starts the config's simulated workers and a gateway process (``router.bench.gateway_proc``) with
the policy and request log given, then sends Poisson arrivals of workflows (``mixed`` 75 %,
``chat`` 25 %, from ``router.bench.workloads``), the rate cycling through ``--rates`` every
``--phase`` seconds so the log covers idle to loaded regimes. Every request carries
``x-workflow-id`` / ``x-workflow-stage``; every verdict goes back as ``POST /v1/feedback``
(the client app knows whether an answer was right; the router learns it only this way).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import time

import httpx
import openai

from router.bench.gateway_proc import command
from router.bench.workloads import CORRECT, make_workflow
from router.config import load_config
from router.serve import running_sims


async def run_workflow(client: openai.AsyncOpenAI, http: httpx.AsyncClient, kind: str, seed: int, index: int,
                       stats: dict[str, int]) -> None:  # fmt: skip
    wf = make_workflow(kind, seed, index)
    stage = 0
    while (step := wf.next_step()) is not None:
        headers = {"X-Agent": step.agent, "x-workflow-id": wf.id, "x-workflow-stage": str(stage)}
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model="auto", messages=step.messages, max_tokens=step.max_tokens, stream=True,
                stream_options={"include_usage": True}, extra_body={"sim": step.sim}, extra_headers=headers,
            )  # fmt: skip
            parts = [c.choices[0].delta.content or "" async for c in raw.parse() if c.choices]
        except openai.APIError:
            stats["errors"] += 1
            return
        text = "".join(parts).rstrip()
        stats["requests"] += 1
        if text.endswith(("[correct]", "[wrong]")):
            verdict = {"request_id": raw.headers["x-request-id"], "correct": text.endswith(CORRECT)}
            await http.post("/v1/feedback", json=verdict, headers={"X-Agent": step.agent})
        wf.record(step, text)
        stage += 1


async def drive(url: str, seed: int, duration: float, rates: list[float], phase: float) -> dict[str, int]:
    rng = random.Random(f"traffic:{seed}")
    stats = {"requests": 0, "errors": 0, "workflows": 0}
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600) as client, \
            httpx.AsyncClient(base_url=url, timeout=30) as http:  # fmt: skip
        tasks: list[asyncio.Task[None]] = []
        t0 = time.monotonic()
        while (now := time.monotonic() - t0) < duration:
            rate = rates[int(now // phase) % len(rates)]
            await asyncio.sleep(rng.expovariate(rate))
            kind = "chat" if rng.random() < 0.25 else "mixed"
            tasks.append(asyncio.create_task(run_workflow(client, http, kind, seed, stats["workflows"], stats)))
            stats["workflows"] += 1
        await asyncio.gather(*tasks)
    return stats


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="scripts/predictor/fleet.yaml")
    ap.add_argument("--policy", default="round_robin")
    ap.add_argument("--log", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--rates", default="0.1,0.3,0.6,0.9")
    ap.add_argument("--phase", type=float, default=30.0)
    args = ap.parse_args()
    cfg = load_config(args.config)
    url = f"http://{cfg.gateway.host}:{cfg.gateway.port}"
    with running_sims(cfg.backends):
        gw = subprocess.Popen(command(args.config, cfg.gateway.port, policy=args.policy, request_log=args.log))
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or gw.poll() is not None:
                    raise SystemExit("the gateway did not start")
                time.sleep(0.2)
            t = time.monotonic()
            stats = asyncio.run(drive(url, args.seed, args.duration, [float(r) for r in args.rates.split(",")],
                                      args.phase))  # fmt: skip
            print(f"{stats} in {time.monotonic() - t:.0f} s -> {args.log}", file=sys.stderr)
        finally:
            gw.terminate()
            gw.wait(timeout=15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
