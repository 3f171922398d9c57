"""How much workers that share one GPU slow each other down: decode TPOT alone, in pairs, all together.

    python scripts/calibrate/colocate.py probe --out colocate.json \\
        qwen2.5-0.5b=http://127.0.0.1:8001 qwen2.5-1.5b=http://127.0.0.1:8002 qwen2.5-7b=http://127.0.0.1:8003
    python scripts/calibrate/colocate.py fit colocate.json

For each batch size and each subset of the workers (each alone, every pair, all), ``batch`` closed-loop
users per worker of the subset send non-streamed ``--tokens``-token completions (``ignore_eos``) of a
``--prompt``-token prompt, back to back; each worker's own inter-token latency histogram (server side,
so the client's speed does not matter) over a window where every worker of the subset is busy gives
its TPOT. The ratio of a worker's TPOT in a subset
to its TPOT alone is its slowdown; `fit_gpu_share` turns those into the share of a decode step that is
GPU work (time-sliced among the processes) rather than CPU work (scheduler, sampler, launches), under
the sim's processor-sharing model (`backends/sim/gpu.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
from typing import Any

import httpx


def _prompt(n: int, rng: random.Random) -> str:
    return " ".join(f"w{rng.randint(3, 150000)}" for _ in range(n))


async def _loop(c: httpx.AsyncClient, url: str, model: str, prompt: str, tokens: int) -> None:
    """One closed-loop user: non-streamed completions back to back (the client reads one body per request,
    so a slow client cannot pace the server's output)."""
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "temperature": 0.0}
    while True:
        (await c.post(url + "/v1/completions", json=body)).raise_for_status()


ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")


async def _itl(c: httpx.AsyncClient, url: str) -> tuple[float, float]:
    """(sum, count) of the server's inter-token latency histogram."""
    text = (await c.get(url + "/metrics")).text
    for name in ITL:
        total = count = None
        for line in text.splitlines():
            if line.startswith(name + "_sum"):
                total = float(line.rsplit(" ", 1)[1])
            elif line.startswith(name + "_count"):
                count = float(line.rsplit(" ", 1)[1])
        if total is not None and count is not None:
            return total, count
    raise RuntimeError(f"{url}/metrics has none of {ITL}")


async def phase(workers: dict[str, str], subset: tuple[str, ...], batch: int, prompt: int, tokens: int,
                rng: random.Random, settle_s: float = 1.5, measure_s: float = 3.0) -> dict[str, Any]:  # fmt: skip
    """``batch`` closed-loop users per worker of ``subset`` for ``settle_s + measure_s``; the server-side mean
    inter-token latency of each worker over the last ``measure_s`` (every worker busy all along)."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
    async with httpx.AsyncClient(timeout=600, limits=limits) as c:
        tasks = [asyncio.create_task(_loop(c, workers[m], m, _prompt(prompt, rng), tokens))
                 for m in subset for _ in range(batch)]  # fmt: skip
        try:
            await asyncio.sleep(settle_s)
            before = {m: await _itl(c, workers[m]) for m in subset}
            await asyncio.sleep(measure_s)
            after = {m: await _itl(c, workers[m]) for m in subset}
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    out: dict[str, Any] = {"subset": list(subset), "batch": batch, "measure_s": measure_s, "tpot_ms": {},
                           "tokens": {}}  # fmt: skip
    for m in subset:
        dn = after[m][1] - before[m][1]
        out["tpot_ms"][m] = round((after[m][0] - before[m][0]) / dn * 1e3, 3) if dn else float("nan")
        out["tokens"][m] = dn
    await asyncio.sleep(0.5)  # let the aborted requests drain before the next phase
    return out


def fit_gpu_share(phases: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per worker and batch: the GPU share ``g`` of its step that explains its slowdowns best.

    Under processor sharing, with every worker of a subset decoding all the time, worker i's step is
    ``c_i + g_i * s_i`` where ``s_i`` is its GPU-work stretch; solved numerically per subset (a fixed
    point over the steps' overlap), ``g`` picked from a grid by least squared error of the slowdowns.
    """
    alone = {(p["subset"][0], p["batch"]): p["tpot_ms"][p["subset"][0]] for p in phases if len(p["subset"]) == 1}
    fits: dict[str, dict[str, float]] = {}
    batches = sorted({p["batch"] for p in phases})
    for b in batches:
        together = [p for p in phases if p["batch"] == b and len(p["subset"]) > 1]
        models = sorted({m for p in together for m in p["subset"]})
        grid = [i / 20 for i in range(21)]
        best: tuple[float, dict[str, float]] | None = None
        for shares in itertools.product(grid, repeat=len(models)):
            g = dict(zip(models, shares, strict=True))
            err = 0.0
            for p in together:
                pred = _shared_steps({m: alone[(m, b)] for m in p["subset"]}, {m: g[m] for m in p["subset"]})
                err += sum((pred[m] / p["tpot_ms"][m] - 1.0) ** 2 for m in p["subset"])
            if best is None or err < best[0]:
                best = (err, g)
        assert best is not None
        for m, share in best[1].items():
            fits.setdefault(m, {})[f"b{b}"] = share
    return fits


def _shared_steps(step: dict[str, float], share: dict[str, float], rounds: int = 200) -> dict[str, float]:
    """Steady-state step times when every worker decodes continuously: the GPU part of each step is
    stretched by the expected number of workers with GPU work in flight (itself + the others' GPU duty)."""
    cur = dict(step)
    for _ in range(rounds):
        nxt = {}
        for m in step:
            # the fraction of time o has GPU work in flight: its (stretched) GPU part over its step
            others = sum((cur[o] - (1.0 - share[o]) * step[o]) / cur[o] for o in step if o != m)
            nxt[m] = step[m] * (1.0 - share[m]) + step[m] * share[m] * (1.0 + others)
        cur = {m: 0.5 * cur[m] + 0.5 * nxt[m] for m in step}
    return cur


async def probe(args: argparse.Namespace) -> list[dict[str, Any]]:
    workers = dict(w.split("=", 1) for w in args.workers)
    rng = random.Random(args.seed)
    names = tuple(workers)
    subsets = [s for k in range(1, len(names) + 1) for s in itertools.combinations(names, k)]
    phases = []
    for m in names:  # warm each once (graph capture is done at start-up; this fills the allocator)
        await phase(workers, (m,), 2, 64, 16, rng, settle_s=0.5, measure_s=0.5)
    for b in (int(x) for x in args.batches.split(",")):
        for s in subsets:
            p = await phase(workers, s, b, args.prompt, args.tokens, rng)
            phases.append(p)
            print(json.dumps(p), flush=True)
    return phases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("probe", help="measure (against live servers)")
    pr.add_argument("workers", nargs="+", metavar="MODEL=URL")
    pr.add_argument("--batches", default="1,8,32")
    pr.add_argument("--prompt", type=int, default=256)
    pr.add_argument("--tokens", type=int, default=200)
    pr.add_argument("--seed", type=int, default=1)
    pr.add_argument("--out", required=True)
    ft = sub.add_parser("fit", help="GPU share of a step per worker and batch, from a probe's JSON")
    ft.add_argument("file")
    args = ap.parse_args(argv)
    if args.cmd == "probe":
        phases = asyncio.run(probe(args))
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"prompt": args.prompt, "tokens": args.tokens, "phases": phases}, f, indent=1)
        return 0
    with open(args.file, encoding="utf-8") as f:
        phases = json.load(f)["phases"]
    for p in phases:
        print(p["batch"], "+".join(p["subset"]), p["tpot_ms"])
    print(json.dumps(fit_gpu_share(phases), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
