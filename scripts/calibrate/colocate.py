"""How much workers that share one GPU slow each other down: decode TPOT alone, in pairs, all together.

    python scripts/calibrate/colocate.py probe --out colocate.json \\
        qwen2.5-0.5b=http://127.0.0.1:8001 qwen2.5-1.5b=http://127.0.0.1:8002 qwen2.5-7b=http://127.0.0.1:8003
    python scripts/calibrate/colocate.py fit colocate.json
    python scripts/calibrate/colocate.py compare colocate.json colocate-sim.json --sim-speedup 0.25
    python scripts/calibrate/colocate.py probe --alone --sampling greedy,bench --batches 1,8 --out alone.json ...
    python scripts/calibrate/colocate.py probe --alone --sampling greedy,temp,mintok,bench --rounds 2 ...

For each batch size and each subset of the workers (each alone, every pair, all), ``batch`` closed-loop
users per worker of the subset send non-streamed ``--tokens``-token completions (``ignore_eos``) of a
``--prompt``-token prompt, back to back; each worker's own inter-token latency histogram (server side,
so the client's speed does not matter) over a window where every worker of the subset is busy gives
its TPOT. ``--alone``: only the phases with one worker busy (its decode step on this boot, neighbours idle).
``--sampling greedy,bench`` runs the phases once per request kind: ``greedy`` (the default; temperature 0, as the
calibration probes) and ``bench`` (what the bench sends through backends/simfields.py: no temperature, so the
server's default 1.0 and random sampling, and ``min_tokens = max_tokens``); a phase run with ``bench`` carries
``"sampling": "bench"``. Same boot, same batch: the difference is the cost of the bench's sampling parameters;
``temp`` and ``mintok`` carry one half of it each, ``topp`` adds vLLM's top-p sort
(``scripts/calibrate/fit_sampling.py`` fits the profiles' ``sampling_s`` from them). ``--rounds N`` repeats
each batch's phases N times, every other round in reverse order (drift within a boot then hits every kind alike).

`fit` explains those TPOTs with the time-slice model of `backends/sim/gpu.py`: each worker's step alone
(its TPOT alone) is CPU work (scheduler, sampler, launches; not shared) followed by GPU work (a share ``g`` of
the step); the driver gives the GPU to the contexts with work in round-robin turns of at most ``q`` (the
timeslice), and handing it to another context costs ``switch``. It fits ``q``, ``switch`` and ``g`` per
worker for each batch alone, and jointly over ``--joint`` batches (one share per worker: the sim's profile
data), and prints real / model TPOT per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
from pathlib import Path
from typing import Any

import httpx


def _prompt(n: int, rng: random.Random) -> str:
    return " ".join(f"w{rng.randint(3, 150000)}" for _ in range(n))


# Request kinds (--sampling): the body's sampling fields, and whether it asks for min_tokens = max_tokens.
# bench: what the bench's requests reach real vLLM with (no temperature: the server's 1.0; min_tokens from
# backends/simfields.py); temp / mintok: one half of it each; topp: random sampling through vLLM's top-p sort.
SAMPLING: dict[str, tuple[dict[str, float], bool]] = {
    "greedy": ({"temperature": 0.0}, False),
    "bench": ({}, True),
    "temp": ({"temperature": 1.0}, False),
    "mintok": ({"temperature": 0.0}, True),
    "topp": ({"temperature": 1.0, "top_p": 0.9}, False),
}


async def _loop(c: httpx.AsyncClient, url: str, model: str, prompt: str, tokens: int, sampling: str = "greedy") -> None:
    """One closed-loop user: non-streamed completions back to back (the client reads one body per request,
    so a slow client cannot pace the server's output)."""
    fields, min_tokens = SAMPLING[sampling]
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True, **fields}
    if min_tokens:
        body["min_tokens"] = tokens
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
                rng: random.Random, settle_s: float = 1.5, measure_s: float = 3.0,
                sampling: str = "greedy") -> dict[str, Any]:  # fmt: skip
    """``batch`` closed-loop users per worker of ``subset`` for ``settle_s + measure_s``; the server-side mean
    inter-token latency of each worker over the last ``measure_s`` (every worker busy all along)."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
    async with httpx.AsyncClient(timeout=600, limits=limits) as c:
        tasks = [asyncio.create_task(_loop(c, workers[m], m, _prompt(prompt, rng), tokens, sampling))
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
                           "tokens": {}, **({"sampling": sampling} if sampling != "greedy" else {})}  # fmt: skip
    for m in subset:
        dn = after[m][1] - before[m][1]
        out["tpot_ms"][m] = round((after[m][0] - before[m][0]) / dn * 1e3, 3) if dn else float("nan")
        out["tokens"][m] = dn
    await asyncio.sleep(0.5)  # let the aborted requests drain before the next phase
    return out


def timeslice_periods(cpu: dict[str, float], gpu: dict[str, float], q: float, switch: float,
                      horizon: float = 600.0, jitter: float = 0.1, seed: int = 0) -> dict[str, float]:  # fmt: skip
    """Mean step period of each worker decoding back to back on one time-sliced GPU (the model of
    `backends/sim/gpu.py`, here as a closed loop in milliseconds).

    A step is ``cpu[m]`` of CPU work (its own, not shared), then ``gpu[m]`` of GPU work. Contexts with GPU
    work take turns in round-robin order; a turn lasts ``min(remaining, q)``; handing the GPU to a different
    context first costs ``switch``; a context whose turn ends with work left goes to the back of the queue.
    Each CPU part is drawn uniformly within ``±jitter`` of its mean (seeded): real CPU work varies, and exact
    ties between workers would make the fit pick knife-edge parameters.
    """
    rng = random.Random(seed)
    names = list(cpu)
    cpu_end: dict[str, float | None] = {m: cpu[m] * k / len(names) for k, m in enumerate(names)}  # staggered
    rem = dict.fromkeys(names, 0.0)
    queue: list[str] = []
    done: dict[str, list[float]] = {m: [] for m in names}
    cur: str | None = None
    last: str | None = None
    t = turn_end = 0.0
    while t < horizon:
        ready = [(v, m) for m, v in cpu_end.items() if v is not None]
        first = min(ready) if ready else (float("inf"), "")
        if cur is not None and turn_end <= first[0]:
            t, m = turn_end, cur
            cur = None
            if rem[m] <= 1e-12:
                done[m].append(t)
                cpu_end[m] = t + cpu[m] * (1.0 + jitter * (2.0 * rng.random() - 1.0))
            else:
                queue.append(m)
        else:
            t, m = first
            cpu_end[m] = None
            rem[m] = gpu[m]
            queue.append(m)
        if cur is None and queue:
            cur = queue.pop(0)
            run = min(rem[cur], q)
            rem[cur] -= run
            turn_end = t + (switch if last not in (None, cur) else 0.0) + run
            last = cur
    out = {}
    for m, ts in done.items():
        ts = [x for x in ts if x > 0.25 * horizon]
        out[m] = (ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 1 else float("nan")
    return out


def _predict(phases: list[dict[str, Any]], alone: dict[tuple[str, int], float], share: dict[tuple[str, int], float],
             q: float, switch: float) -> list[dict[str, float]]:  # fmt: skip
    """Predicted TPOT (ms) of every worker of every phase: its step alone split into ``share`` GPU work and the
    rest CPU, run through `timeslice_periods`."""
    out = []
    for p in phases:
        b, sub = p["batch"], p["subset"]
        if len(sub) == 1:
            out.append({sub[0]: alone[(sub[0], b)]})
            continue
        g = {m: share[(m, b)] * alone[(m, b)] for m in sub}
        out.append(timeslice_periods({m: alone[(m, b)] - g[m] for m in sub}, g, q, switch))
    return out


def fit_timeslice(phases: list[dict[str, Any]], batches: list[int], per_batch_share: bool = False,
                  seed: int = 1) -> dict[str, Any]:  # fmt: skip
    """Least squares over the relative TPOT errors of the shared phases of ``batches``: the timeslice ``q`` and
    context-switch cost (ms, one each), and the GPU share of a step per worker (per worker and batch with
    ``per_batch_share``). Bounded, seeded differential evolution (the error is piecewise smooth in ``q``: a
    step's number of turns jumps), polished by Nelder-Mead."""
    from scipy.optimize import differential_evolution, minimize

    alone = {(p["subset"][0], p["batch"]): p["tpot_ms"][p["subset"][0]] for p in phases if len(p["subset"]) == 1}
    shared = [p for p in phases if p["batch"] in batches and len(p["subset"]) > 1]
    models = sorted({m for m, _ in alone})
    keys = [(m, b) for m in models for b in batches] if per_batch_share else [(m, 0) for m in models]

    def unpack(x: Any) -> tuple[float, float, dict[tuple[str, int], float]]:
        g = dict(zip(keys, (float(v) for v in x[2:]), strict=True))
        return float(x[0]), float(x[1]), {(m, b): g[(m, b if per_batch_share else 0)] for m in models for b in batches}

    def err(x: Any) -> float:
        q, sw, share = unpack(x)
        if not (0.2 <= q and 0.0 <= sw and all(0.0 <= v <= 1.0 for v in share.values())):
            return 1e9
        pred = _predict(shared, alone, share, q, sw)
        return sum((pr[m] / p["tpot_ms"][m] - 1.0) ** 2 for p, pr in zip(shared, pred, strict=True) for m in pr)

    bounds = [(0.5, 4.0), (0.0, 0.5)] + [(0.2, 1.0)] * len(keys)
    de = differential_evolution(err, bounds, seed=seed, maxiter=60, popsize=12, tol=1e-6, polish=False)
    nm = minimize(err, de.x, method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-8, "maxiter": 3000})
    x = nm.x if nm.fun < de.fun else de.x
    q, sw, share = unpack(x)
    return {"batches": batches, "timeslice_ms": round(q, 3), "switch_ms": round(sw, 3),
            "gpu_share": {f"{m}@{b}" if per_batch_share else m: round(share[(m, b)], 3)
                          for m in models for b in (batches if per_batch_share else batches[:1])},
            "share": share, "sse": round(float(err(x)), 5)}  # fmt: skip


def error_table(phases: list[dict[str, Any]], fit: dict[str, Any]) -> list[str]:
    """Markdown rows: per shared phase, real / model TPOT (ms) and the error, for the phases whose batch the
    fit has a share for (so a joint fit can be checked on another batch by passing its shares)."""
    alone = {(p["subset"][0], p["batch"]): p["tpot_ms"][p["subset"][0]] for p in phases if len(p["subset"]) == 1}
    share = fit["share"]
    shared = [p for p in phases if len(p["subset"]) > 1 and all((m, p["batch"]) in share for m in p["subset"])]
    pred = _predict(shared, alone, share, fit["timeslice_ms"], fit["switch_ms"])
    rows = ["| batch | workers | TPOT real / model, ms (error) | max error |", "| --- | --- | --- | --- |"]
    for p, pr in zip(shared, pred, strict=True):
        errs = {m: pr[m] / p["tpot_ms"][m] - 1.0 for m in p["subset"]}
        cells = ", ".join(f"{m.removeprefix('qwen2.5-')} {p['tpot_ms'][m]:.2f} / {pr[m]:.2f} ({100 * e:+.0f}%)"
                          for m, e in errs.items())  # fmt: skip
        rows.append(f"| {p['batch']} | {'+'.join(m.removeprefix('qwen2.5-') for m in p['subset'])} | {cells} "
                    f"| {100 * max(abs(e) for e in errs.values()):.0f}% |")  # fmt: skip
    return rows


def compare(
    real: list[dict[str, Any]], sim: list[dict[str, Any]], sim_speedup: float
) -> tuple[list[str], list[tuple[bool, float]]]:
    """Markdown rows, real / sim TPOT per phase and worker (sim x ``sim_speedup``: H200 time), and every error
    (with whether the worker shared the GPU in that phase)."""
    by_key = {(p["batch"], tuple(p["subset"])): p for p in sim}
    rows = ["| batch | workers | TPOT real / sim, ms (Δ) |", "| --- | --- | --- |"]
    errs: list[tuple[bool, float]] = []
    for r in real:
        s = by_key.get((r["batch"], tuple(r["subset"])))
        if s is None:
            continue
        cells = []
        for m in r["subset"]:
            a, b = r["tpot_ms"][m], s["tpot_ms"][m] * sim_speedup
            errs.append((len(r["subset"]) > 1, b / a - 1.0))
            cells.append(f"{m.removeprefix('qwen2.5-')} {a:.2f} / {b:.2f} ({100 * (b / a - 1.0):+.0f}%)")
        names = "+".join(m.removeprefix("qwen2.5-") for m in r["subset"])
        rows.append(f"| {r['batch']} | {names} | {', '.join(cells)} |")
    return rows, errs


def predicted_phases(
    real: dict[str, Any], profiles: dict[str, dict[str, Any]], q_ms: float, switch_ms: float
) -> list[dict[str, Any]]:
    """The probe's phases as the sim would run them, without running it: each worker's decode step from its
    profile's linear model (batch b, mid-answer context), split by its ``gpu_share``, through
    :func:`timeslice_periods` (the model of backends/sim/gpu.py). For judging a refitted profile at once."""
    ctx = real["prompt"] + real["tokens"] / 2
    out = []
    for p in real["phases"]:
        if p.get("sampling", "greedy") != "greedy" or not all(m in profiles for m in p["subset"]):
            continue
        b, parts = p["batch"], {}
        for m in p["subset"]:
            st, g = profiles[m]["step_time_s"], profiles[m].get("gpu_share", 1.0)
            step = 1e3 * (st["base"] + b * st["decode_seqs"] + b * ctx * st["decode_context_tokens"])
            parts[m] = ((1.0 - g) * step, g * step)
        tpot = (
            {m: c + g for m, (c, g) in parts.items()}
            if len(parts) == 1
            else timeslice_periods(
                {m: c for m, (c, _) in parts.items()}, {m: g for m, (_, g) in parts.items()}, q_ms, switch_ms
            )
        )
        out.append({"subset": p["subset"], "batch": b, "tpot_ms": tpot})
    return out


async def probe(args: argparse.Namespace) -> list[dict[str, Any]]:
    workers = dict(w.split("=", 1) for w in args.workers)
    rng = random.Random(args.seed)
    names = tuple(workers)
    subsets = [s for k in range(1, 2 if args.alone else len(names) + 1) for s in itertools.combinations(names, k)]
    samplings = args.sampling.split(",")
    if unknown := set(samplings) - set(SAMPLING):
        raise SystemExit(f"--sampling: unknown {sorted(unknown)} (one of {', '.join(SAMPLING)})")
    phases: list[dict[str, Any]] = []
    for m in names:  # warm each once (graph capture is done at start-up; this fills the allocator)
        await phase(workers, (m,), 2, 64, 16, rng, settle_s=0.5, measure_s=0.5)
    for b in (int(x) for x in args.batches.split(",")):
        for r in range(args.rounds):
            for s in subsets:
                # back to back, so a boot's drift hits every kind alike; every other round in reverse order
                for sampling in samplings if r % 2 == 0 else samplings[::-1]:
                    p = await phase(workers, s, b, args.prompt, args.tokens, rng, settle_s=args.settle_s,
                                    measure_s=args.measure_s, sampling=sampling)  # fmt: skip
                    phases.append(p | ({"round": r} if args.rounds > 1 else {}))
                    print(json.dumps(phases[-1]), flush=True)
                    _write(args, phases)  # after every phase: a run cut short by a timeout keeps what it measured
    return phases


def _write(args: argparse.Namespace, phases: list[dict[str, Any]]) -> None:
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"prompt": args.prompt, "tokens": args.tokens, "phases": phases}, f, indent=1)


def _pair(text: str) -> tuple[float, float]:
    try:
        q, sw = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers Q,S (ms), got {text!r}") from None
    return q, sw


def _print_compare(rows: list[str], errs: list[tuple[bool, float]]) -> None:
    if rows:
        print("\n".join(rows))
    for label, sel in (("all", errs), ("sharing the GPU", [x for x in errs if x[0]])):
        e = sorted(abs(d) for _, d in sel)
        if e:
            print(f"{label}: {sum(d <= 0.10 for d in e)} of {len(e)} worker-phases within 10%, "
                  f"median |Δ| {100 * e[len(e) // 2]:.0f}%")  # fmt: skip


def fit_constants(reals: list[dict[str, Any]], profiles: dict[str, dict[str, Any]], seed: int = 1) -> dict[str, Any]:
    """The sim's timeslice and switch cost (ms, ``backends/sim/gpu.py``'s constants) that best explain the probes'
    shared greedy phases with the profiles' own steps (:func:`predicted_phases`: each profile's linear decode step and
    ``gpu_share``, as the sim runs them): least squares over the relative TPOT errors of every worker of every shared
    phase of every probe in ``reals``. Bounded, seeded differential evolution (a step's number of turns jumps with
    the timeslice), polished by Nelder-Mead. Unlike :func:`fit_timeslice`, the workers' steps are not refitted to
    the probe's boot: the sim's constants are fitted to the sim's profiles."""
    from scipy.optimize import differential_evolution, minimize

    shared = [{**real, "phases": [p for p in real["phases"]
                                  if len(p["subset"]) > 1 and p.get("sampling", "greedy") == "greedy"]}
              for real in reals]  # fmt: skip

    def err(x: Any) -> float:
        q, sw = float(x[0]), float(x[1])
        if q < 0.2 or sw < 0.0:
            return 1e9
        return sum((pr["tpot_ms"][m] / p["tpot_ms"][m] - 1.0) ** 2
                   for real in shared
                   for p, pr in zip(real["phases"], predicted_phases(real, profiles, q, sw), strict=True)
                   for m in p["subset"])  # fmt: skip

    de = differential_evolution(err, [(0.5, 4.0), (0.0, 1.0)], seed=seed, maxiter=40, popsize=10, tol=1e-7,
                                polish=False)  # fmt: skip
    nm = minimize(err, de.x, method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-8, "maxiter": 500})
    x = nm.x if nm.fun < de.fun else de.x
    return {"timeslice_ms": round(float(x[0]), 3), "switch_ms": round(float(x[1]), 3), "sse": round(float(err(x)), 5),
            "phases": sum(len(real["phases"]) for real in shared)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("probe", help="measure (against live servers)")
    pr.add_argument("workers", nargs="+", metavar="MODEL=URL")
    pr.add_argument("--batches", default="1,8,32")
    pr.add_argument("--prompt", type=int, default=256)
    pr.add_argument("--tokens", type=int, default=200)
    pr.add_argument("--seed", type=int, default=1)
    pr.add_argument("--alone", action="store_true", help="only the phases with one worker busy")
    pr.add_argument(
        "--sampling",
        default="greedy",
        help="comma-separated: greedy (temperature 0), bench (the server's default temperature and min_tokens = "
        "max_tokens, as the bench's requests), temp (temperature 1), mintok (temperature 0 + min_tokens), "
        "topp (temperature 1, top_p 0.9)",
    )
    pr.add_argument("--rounds", type=int, default=1, help="each batch's phases this many times (alternate order)")
    pr.add_argument("--settle-s", type=float, default=1.5, help="seconds of load before each measurement")
    pr.add_argument("--measure-s", type=float, default=3.0, help="seconds each phase is measured over")
    pr.add_argument("--out", required=True)
    ft = sub.add_parser("fit", help="time-slice model (timeslice, switch cost, GPU share per worker) from a probe")
    ft.add_argument("file")
    ft.add_argument("--joint", default="1,8", help="batches the joint fit (one share per worker) is made on")
    cp = sub.add_parser("compare", help="real against sim TPOT per phase, from two probes' JSON")
    cp.add_argument("real")
    cp.add_argument("sim")
    cp.add_argument("--sim-speedup", type=float, default=1.0, help="the sim's --speedup (its TPOT x it: H200 time)")
    pd = sub.add_parser("predict", help="real against the sim's model run on a set of profiles (no sim started)")
    pd.add_argument("real", nargs="+", help="one or more probes (each boot's table in turn)")
    pd.add_argument("--profiles", required=True, help="a folder of h200-<model>.json")
    pd.add_argument("--batches", default="1,8", help="the phases to compare (the sim's constants: batches 1, 8)")
    pd.add_argument(
        "--fit", action="store_true", help="also fit the timeslice and switch cost to these probes with these profiles"
    )
    pd.add_argument("--constants", metavar="Q,S", type=_pair,
                    help="also these timeslice and switch cost (ms), e.g. earlier ones")  # fmt: skip
    args = ap.parse_args(argv)
    if args.cmd == "compare":
        with open(args.real, encoding="utf-8") as f, open(args.sim, encoding="utf-8") as g:
            rows, errs = compare(json.load(f)["phases"], json.load(g)["phases"], args.sim_speedup)
        _print_compare(rows, errs)
        return 0
    if args.cmd == "predict":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from backends.sim.gpu import SWITCH_S, TIMESLICE_S

        keep = {int(b) for b in args.batches.split(",")}
        reals = []
        for path in args.real:
            with open(path, encoding="utf-8") as f:
                real = json.load(f)
            # the model's steps are the probes' (greedy): a probe's bench-sampling phases are not its kind
            phases = [p for p in real["phases"] if p["batch"] in keep and p.get("sampling", "greedy") == "greedy"]
            reals.append({**real, "phases": phases})
        profiles = {}
        for m in sorted({m for real in reals for p in real["phases"] for m in p["subset"]}):
            with open(f"{args.profiles}/h200-{m}.json", encoding="utf-8") as f:
                profiles[m] = json.load(f)
        constants = [("the sim's constants", TIMESLICE_S * 1e3, SWITCH_S * 1e3)]
        if args.constants:
            constants.append(("given", *args.constants))
        if args.fit:
            fit = fit_constants(reals, profiles)
            print(json.dumps(fit))
            constants.append(("fitted", fit["timeslice_ms"], fit["switch_ms"]))
        for label, q, sw in constants:
            print(f"\n### {label}: timeslice {q:.3f} ms, switch {sw:.3f} ms")
            every: list[tuple[bool, float]] = []
            for path, real in zip(args.real, reals, strict=True):
                rows, errs = compare(real["phases"], predicted_phases(real, profiles, q, sw), 1.0)
                print(f"\n{path}")
                _print_compare(rows, errs)
                every += errs
            if len(reals) > 1:
                print("\nevery probe")
                _print_compare([], every)
        return 0
    if args.cmd == "probe":
        _write(args, asyncio.run(probe(args)))
        return 0
    with open(args.file, encoding="utf-8") as f:
        phases = json.load(f)["phases"]
    for p in phases:
        print(p["batch"], "+".join(p["subset"]), p.get("sampling", "greedy"), p["tpot_ms"])
    phases = [p for p in phases if p.get("sampling", "greedy") == "greedy"]  # the model is fitted on greedy runs
    if not any(len(p["subset"]) > 1 for p in phases):
        return 0  # an --alone probe: nothing shares the GPU
    batches = sorted({p["batch"] for p in phases})
    fits = [fit_timeslice(phases, [b]) for b in batches]
    joint = fit_timeslice(phases, [int(b) for b in args.joint.split(",")])
    for fit in [*fits, joint]:
        label = "per batch" if len(fit["batches"]) == 1 else "joint (the sim's constants)"
        print(f"\n### fit on batch {','.join(map(str, fit['batches']))}: {label}")
        summary = {k: fit[k] for k in ("timeslice_ms", "switch_ms", "gpu_share", "sse")}
        print(json.dumps(summary))
        if fit is joint:  # every batch, with the joint shares (batches not fitted are a check)
            fit = {**fit, "share": {(m, b): v for (m, _), v in fit["share"].items() for b in batches}}
        print("\n".join(error_table(phases, fit)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
