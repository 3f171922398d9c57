"""Benchmark overload handling: per-agent SLA attainment, 429s, degradations, 5xx and
queue waits at 2x and 3x the fleet's capacity, over several seeds (chimera_bench.overload).

    python scripts/bench_overload.py --multiples 2,3 --seeds 0,1,2 --baseline --out docs/bench_overload.json

Each run is a fresh `chimera serve` process (it starts the two simulated workers itself) on a
config written from the scenario; the load comes from this process through the openai SDK. With
``--baseline`` every multiple also runs once (seed 0) with ``gateway.admission`` removed, for
comparison. Prints a markdown table (the one in docs/benchmarks.md, "Overload").

    python scripts/bench_overload.py --modes none,static,adaptive --multiples 1,2,3 --seeds 0,1,2 \
        --out docs/results/overload-adaptive.json

runs every multiple and seed without admission (``none``), with the static ``kv_full_ratio`` (``static``) and with
``adaptive: true`` (``adaptive``), and prints one line per multiple and mode: the interactive agent's TTFT p99 and
SLA attainment, goodput (requests that met their agent's SLA per second) and throughput (answers per second), each
the mean over the seeds (docs/benchmarks.md, "Adaptive admission").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from backends.listen import free_port, wait_ready
from chimera_bench.overload import Scenario, drive, read_queue_waits, scenario_config, summarize


def run(s: Scenario, tmp: Path, workers: list[str] | None = None) -> dict[str, Any]:
    """One scenario through a fresh ``chimera serve``: on simulated workers it starts, or on ``workers`` (URLs of
    running servers, e.g. real vLLM: they must serve the scenario's model with its KV budget and scheduling)."""
    port = free_port()
    urls = {f"w{i}": u for i, u in enumerate(workers or [f"http://127.0.0.1:{free_port()}" for _ in range(s.workers)])}
    log = tmp / f"requests-{s.multiple}-{s.seed}-{int(s.admission)}.jsonl"
    cfg = scenario_config(s, urls, sims=not workers, request_log=str(log))
    path = tmp / "overload.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "router.cli", "serve", "--config", str(path), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base + "/ready", 60, proc=proc)
        outcomes = asyncio.run(drive(base, s))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"scenario": {"multiple": s.multiple, "seed": s.seed, "admission": s.admission, "adaptive": s.adaptive,
                         "speedup": s.speedup, "max_tokens_scale": s.max_tokens_scale,
                         "duration_s": s.duration_s, "drain_s": s.drain_s, "kv_tokens": s.kv_tokens,
                         "workers": s.workers, "scheduling_policy": s.scheduling_policy,
                         "workers_at": list(urls.values()) if workers else "sims"},
            "agents": summarize(s, outcomes, read_queue_waits(log) if log.exists() else {})}  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    head = ("| load | admission | workers' scheduling | seed | agent | prio / on_overload | req | SLA att. "
            "| 429 (w/ Retry-After) | degraded | 5xx | max queue wait / deadline (s) "
            "| bulk after load drop |")  # fmt: skip
    lines = [head, "|" + "---|" * 13]
    for r in results:
        sc = r["scenario"]
        for name, a in r["agents"].items():
            drain = f"{a['drain_ok']}/{a['drain_requests']}" if a["drain_requests"] else ""
            lines.append(
                f"| {sc['multiple']:g}x | {'on' if sc['admission'] else 'off'} | {sc.get('scheduling_policy', 'fcfs')} "
                f"| {sc['seed']} | {name} "
                f"| {a['priority']} / {a['on_overload']} | {a['requests']} | {a['sla_attainment']:.3f} "
                f"| {a['rejected_429']} ({a['retry_after_present']}) | {a['degraded']} | {a['5xx']} "
                f"| {a['max_queue_wait_s']:.2f} / {a['deadline_s']:.2f} | {drain} |"
            )
    return "\n".join(lines)


def mode_of(sc: dict[str, Any]) -> str:
    return "adaptive" if sc.get("adaptive") else "static" if sc["admission"] else "none"


def modes_table(results: list[dict[str, Any]]) -> str:
    """Per multiple and mode, means over seeds: interactive TTFT p99 and SLA, goodput and throughput (per second of
    offered load, the drain included)."""
    rows: dict[tuple[float, str], list[tuple[float, float, float, float, int]]] = {}
    for r in results:
        sc, agents = r["scenario"], r["agents"]
        span = sc["duration_s"] + sc["drain_s"]
        ia = agents["interactive"]
        rows.setdefault((sc["multiple"], mode_of(sc)), []).append((
            ia["ttft_p99_ms"] or 0.0, ia["sla_attainment"] or 0.0,
            sum(a["sla_met"] for a in agents.values()) / span, sum(a["ok"] for a in agents.values()) / span,
            sum(a["5xx"] + a["other_errors"] for a in agents.values()),
        ))  # fmt: skip
    lines = ["| load | admission | seeds | interactive TTFT p99 (ms) | interactive SLA | goodput (rps) "
             "| throughput (rps) | errors |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    order = ["none", "static", "adaptive"]
    for (m, mode), xs in sorted(rows.items(), key=lambda kv: (kv[0][0], order.index(kv[0][1]))):
        k = len(xs)
        mean = [sum(x[i] for x in xs) / k for i in range(4)]
        lines.append(f"| {m:g}x | {mode} | {k} | {mean[0]:.0f} | {mean[1]:.3f} | {mean[2]:.2f} | {mean[3]:.2f} "
                     f"| {sum(x[4] for x in xs)} |")  # fmt: skip
    return "\n".join(lines)


def _scale(text: str) -> float:
    try:
        Scenario(max_tokens_scale=float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return float(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--multiples", default="2,3")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--drain", type=float, default=6.0)
    ap.add_argument("--speedup", type=float, default=0.25)
    ap.add_argument("--baseline", action="store_true", help="also run each multiple once without admission")
    ap.add_argument("--no-admission", action="store_true", help="run every seed without admission control")
    ap.add_argument(
        "--scheduling-policy",
        default="fcfs",
        choices=("fcfs", "priority"),
        help="the workers' scheduling (priority: each request's priority reaches the sims' queues)",
    )
    ap.add_argument("--modes", default="", help="none,static,adaptive: run every multiple and seed in each (overrides "
                    "--baseline and --no-admission)")  # fmt: skip
    ap.add_argument("--max-tokens-scale", type=_scale, default=1.0,
                    help="each request asks for this many times its agent's max_tokens (answers as long as before)")
    ap.add_argument("--urls", default="", help="comma-separated URLs of running workers (real vLLM) instead of sims")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    scenarios = []
    for m in (float(x) for x in args.multiples.split(",")):
        kw = {"multiple": m, "duration_s": args.duration, "drain_s": args.drain, "speedup": args.speedup,
              "scheduling_policy": args.scheduling_policy, "max_tokens_scale": args.max_tokens_scale}  # fmt: skip
        if args.modes:
            scenarios += [Scenario(seed=int(seed), admission=mode != "none", adaptive=mode == "adaptive", **kw)
                          for seed in args.seeds.split(",") for mode in args.modes.split(",")]  # fmt: skip
            continue
        scenarios += [Scenario(seed=int(seed), admission=not args.no_admission, **kw)
                      for seed in args.seeds.split(",")]  # fmt: skip
        if args.baseline:
            scenarios.append(Scenario(seed=0, admission=False, **kw))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in scenarios:
            results.append(run(s, Path(tmp), args.urls.split(",") if args.urls else None))
            print(table(results[-1:]).split("\n", 2)[2], flush=True)
    print(table(results))
    if args.modes:
        print(modes_table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
