"""The bench on real vLLM workers, and the simulator against them (scripts/h200_validate.sh runs the real side).

python scripts/real_vllm.py backends CONFIG
    one line per worker the config launches (``launch:``): name, port, model, profile, seed (its sim twin's)
python scripts/real_vllm.py configs CONFIG --real-out R.yaml [--sim-out S.yaml [--speedup X]]
    R: the same fleet and agents, each backend's url moved to its sim-fields proxy (port + 1000:
       ``python -m chimera_bench.simfields``, which gives real vLLM the bench's exact output lengths and verdicts)
    S: the same fleet as simulated workers (each backend's profile, its real KV budget, seeds 1, 2, ...); backends
       on one GPU share one simulated GPU clock, as they share the real GPU
python scripts/real_vllm.py merge OUT.json DIR...
    the results.json entries of several benches as one list
python scripts/real_vllm.py shares LOG.jsonl [LOG2.jsonl ...] [--margin 0.1]
    per gateway request log (one boot of the fleet each): every agent's share of steps per worker, and over the
    near-tie decisions (the runner-up's expected cost within the margin: the log's predicted.cost_gap) each
    worker's share; then how far each agent's shares moved from log to log
python scripts/real_vllm.py peers DIR
    the runs of scripts/h200_peers.sh in DIR (mixed-w<cost>-s<seed>/, chat-s<seed>/) as DIR/real-{mixed,chat}.json,
    predictive's rows named predictive_w<cost>, and per workload a table: workflow e2e p50, the peer's over each
    row's per seed, task success pooled over the seeds' workflows, SLA, TPOT p50 and the share of steps per model
python scripts/real_vllm.py table --real R.json [R2.json ...] --sim S.json [S2.json ...] [--real-counters per-run]
    TTFT, TPOT, e2e p50 / p99 per workload and policy, sim (scaled to modelled time) against real, and each
    run's prefix-cache hit rate; then how many latencies are within 10 %, by metric and by policy

The sim side: ``chimera bench --config S.yaml`` with the real runs' workload, policies, rates and seeds (at
``--speedup X`` the bench's rates are wall clock: give the real rate x X). A bench reports each run's own worker
counters (``worker_counters_since: run``); results of older benches counted from the workers' boot, and the table
then takes each run's share as the difference from the run before (``--real-counters cumulative``, the default for
such files: the runs of one boot ordered by their counters).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

PROXY_OFFSET = 1000
METRICS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "e2e"))
COUNTERS = ("prefix_cache_queries", "prefix_cache_hits")


def _load(path: str) -> dict[str, Any]:
    data = yaml.safe_load(Path(path).read_text())
    assert isinstance(data, dict)
    return data


def cmd_backends(args: argparse.Namespace) -> None:
    for i, b in enumerate((b for b in _load(args.config)["backends"] if b.get("launch")), 1):
        print(b["name"], int(b["url"].rsplit(":", 1)[1]), b["model"], b.get("profile", ""), i)


def cmd_configs(args: argparse.Namespace) -> None:
    src = _load(args.config)
    real = json.loads(json.dumps(src))
    for b in real["backends"]:
        host, port = b["url"].rsplit(":", 1)
        b["url"] = f"{host}:{int(port) + PROXY_OFFSET}"
        b.pop("launch", None)
    Path(args.real_out).write_text(yaml.safe_dump(real, sort_keys=False))
    if args.sim_out:
        sim = json.loads(json.dumps(src))
        for i, b in enumerate(sim["backends"], 1):
            b.pop("launch", None)
            b["sim"] = {"profile": b["profile"], "speedup": args.speedup, "seed": i, "kv_tokens": b["kv_budget_tokens"]}
        Path(args.sim_out).write_text(yaml.safe_dump(sim, sort_keys=False))


def cmd_merge(args: argparse.Namespace) -> None:
    entries: list[dict[str, Any]] = []
    for d in args.dirs:
        if (f := Path(d) / "results.json").exists():
            entries += json.loads(f.read_text())
    Path(args.out).write_text(json.dumps(entries, indent=1) + "\n")
    print(f"{args.out}: {len(entries)} entries")


def modelled_ms(e: dict[str, Any], key: str, q: str) -> float | None:
    """Percentile ``q`` of latency ``key`` of one bench entry, in modelled time (a sim at speedup s ran 1/s slower)."""
    v = (e.get(key) or {}).get(q)
    return None if v is None else float(v) * float((e.get("config") or {}).get("speedup", 1.0))


def per_run_counters(entries: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, dict[str, float]]]:
    """Each run's own worker counters from runs of one boot whose counters count from the boot: the runs in the
    order of their total prefix-cache queries, each minus the one before. Raises ValueError when a worker's
    counter goes down on the way (not one boot: its runs' counters are their own already)."""

    def total(e: dict[str, Any]) -> float:
        return float(sum(c.get("prefix_cache_queries", 0.0) for c in e["worker_counters"].values()))

    out: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
    prev: dict[str, dict[str, float]] = {}
    for e in sorted((e for e in entries if e.get("worker_counters")), key=total):
        run: dict[str, dict[str, float]] = {}
        for w, c in e["worker_counters"].items():
            run[w] = {k: c.get(k, 0.0) - prev.get(w, {}).get(k, 0.0) for k in COUNTERS}
            if min(run[w].values()) < 0:
                raise ValueError(f"{e['workload']} {e['policy']}: {w}'s counters went down since the run before; "
                                 "these runs' counters are not cumulative (use --real-counters per-run)")  # fmt: skip
        out[(e["workload"], e["policy"])] = run
        prev = e["worker_counters"]
    return out


def hit_rate(counters: dict[str, dict[str, float]] | None) -> float | None:
    if not counters:
        return None
    q = sum(c.get("prefix_cache_queries", 0.0) for c in counters.values())
    return sum(c.get("prefix_cache_hits", 0.0) for c in counters.values()) / q if q else None


def table(real: list[dict[str, Any]], sim: list[dict[str, Any]],
          real_cumulative: bool = True) -> tuple[list[str], list[tuple[str, float, str]]]:  # fmt: skip
    """Markdown rows per workload and policy, and every relative sim-real difference (metric, difference, policy)."""
    rows = ["| workload | policy | rate (wf/s, modelled) | " + " | ".join(
        f"{label} {q} real / sim (Δ)" for _, label in METRICS for q in ("p50", "p99"))
        + " | requests real / sim | prefix-cache hit real / sim |", "|" + " --- |" * 11]  # fmt: skip
    diffs: list[tuple[str, float, str]] = []
    by_key = {(e["workload"], e["policy"]): e for e in sim}
    real_runs = (per_run_counters(real) if real_cumulative
                 else {(e["workload"], e["policy"]): e.get("worker_counters") or {} for e in real})  # fmt: skip
    for r in real:
        s = by_key.get((r["workload"], r["policy"]))
        rate = r.get("rate")
        cells = [r["workload"], r["policy"], f"{rate:g}" if rate is not None else "-"]
        for key, _ in METRICS:
            for q in ("p50", "p99"):
                a, b = modelled_ms(r, key, q), modelled_ms(s, key, q) if s else None
                if a is None or b is None:
                    cells.append("-")
                    continue
                d = (b - a) / a if a else 0.0
                diffs.append((f"{key.split('_')[0].upper()} {q}", d, r["policy"]))
                digits = 0 if a >= 100 else 1
                cells.append(f"{a:.{digits}f} / {b:.{digits}f} ({100 * d:+.0f}%)")
        cells.append(f"{r['requests']} / {s['requests'] if s else '-'}")
        hr = hit_rate(real_runs.get((r["workload"], r["policy"])))
        hs = hit_rate(s.get("worker_counters") if s else None)
        cells.append(" / ".join("-" if h is None else f"{100 * h:.1f} %" for h in (hr, hs)))
        rows.append("| " + " | ".join(cells) + " |")
    return rows, diffs


def cmd_table(args: argparse.Namespace) -> None:
    real = [e for f in args.real for e in json.loads(Path(f).read_text())]
    sim = [e for f in args.sim for e in json.loads(Path(f).read_text())]
    own = all(e.get("worker_counters_since") == "run" for e in real)  # a bench reports each run's own counters
    rows, diffs = table(real, sim, real_cumulative=args.real_counters == "cumulative" and not own)
    print("\n".join(rows))
    if not diffs:
        return
    within = sum(abs(d) <= 0.10 for _, d, _ in diffs)
    print(f"\n{within} of {len(diffs)} sim latencies within 10% of real; "
          f"median |Δ| {100 * sorted(abs(d) for _, d, _ in diffs)[len(diffs) // 2]:.0f}%")  # fmt: skip
    for name, keyed in {"metric": [(m, d) for m, d, _ in diffs], "policy": [(p, d) for _, d, p in diffs]}.items():
        counts: dict[str, list[int]] = {}  # by policy too: a policy's routing may follow the sim's timing
        for k, d in keyed:
            counts.setdefault(k, [0, 0])[0] += abs(d) <= 0.10
            counts[k][1] += 1
        print(f"within 10% by {name}: " + ", ".join(f"{m} {a}/{n}" for m, (a, n) in counts.items()))


def cmd_shares(args: argparse.Namespace) -> None:
    runs: list[dict[str, dict[str, float]]] = []
    for path in args.logs:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        rows = [r for r in rows if r.get("type") is None and r.get("agent") and r.get("backend")]
        steps: dict[str, dict[str, int]] = {}
        near: dict[str, int] = {}
        for r in rows:
            by = steps.setdefault(r["agent"], {})
            by[r["backend"]] = by.get(r["backend"], 0) + 1
            gap = (r.get("predicted") or {}).get("cost_gap")
            if gap is not None and gap <= args.margin:
                near[r["backend"]] = near.get(r["backend"], 0) + 1
        share = {a: {b: n / sum(by.values()) for b, n in sorted(by.items())} for a, by in sorted(steps.items())}
        runs.append(share)
        total = sum(near.values())
        print(f"{path}: {len(rows)} steps; near ties (cost gap <= {args.margin:g}): {total}, "
              + ", ".join(f"{b} {n / total:.0%}" for b, n in sorted(near.items())) if total else "none")
        for a, sh in share.items():
            print(f"  {a:10s} {sum(steps[a].values()):4d} steps  " + "  ".join(f"{b} {x:.0%}" for b, x in sh.items()))
    for a in sorted({a for run in runs for a in run}):
        workers = sorted({b for run in runs for b in run.get(a, {})})
        moved = max(max(run.get(a, {}).get(b, 0.0) for run in runs) - min(run.get(a, {}).get(b, 0.0) for run in runs)
                    for b in workers)  # fmt: skip
        top = max(max(run.get(a, {}).values(), default=0.0) for run in runs)
        print(f"{a:10s} most to one worker {top:.0%}, moved at most {moved * 100:.0f} points across the logs")


def cmd_peers(args: argparse.Namespace) -> None:
    root = Path(args.dir)
    runs: dict[str, list[dict[str, Any]]] = {"mixed": [], "chat": []}
    for d in sorted(root.iterdir()):
        if not (m := re.fullmatch(r"(mixed)-w([\d.]+)-s\d+|(chat)-s\d+", d.name)):
            continue
        wl, cost = m.group(1) or m.group(3), m.group(2)
        if not (f := d / f"real-{wl}.json").exists():
            continue
        for e in json.loads(f.read_text()):
            if e["policy"] == "predictive" and cost:
                e["policy"] = f"predictive_w{cost}"
            runs[wl].append(e)
    for wl, entries in runs.items():
        if not entries:
            continue
        (root / f"real-{wl}.json").write_text(json.dumps(entries, indent=1) + "\n")
        peer = {e["seed"]: e["workflow_e2e_ms"]["p50"] for e in entries if ":" in e["policy"]}
        print(f"{wl} ({root / f'real-{wl}.json'}): router | wf e2e p50 ms | peer / this per seed | success % | "
              "SLA % | TPOT p50 ms | share of steps")
        for pol in sorted({e["policy"] for e in entries}, key=lambda p: (":" not in p, p)):  # the peer first
            rows = sorted((e for e in entries if e["policy"] == pol), key=lambda e: e["seed"])
            p50 = [e["workflow_e2e_ms"]["p50"] for e in rows]
            ratios = ", ".join(f"{peer[e['seed']] / e['workflow_e2e_ms']['p50']:.2f}" for e in rows
                               if e["seed"] in peer)  # fmt: skip
            wfs = sum(e["workflows"] for e in rows)
            success = sum(e["task_success"] * e["workflows"] for e in rows) / wfs
            sla = statistics.mean(e["sla_attainment"] for e in rows)
            tpot = "-".join(f"{x:.1f}" for x in (min(e["tpot_ms"]["p50"] for e in rows),
                                                  max(e["tpot_ms"]["p50"] for e in rows)))  # fmt: skip
            models = sorted({m for e in rows for m in e["model_share"]})
            share = " / ".join(f"{m} {statistics.mean(e['model_share'].get(m, 0) for e in rows):.0%}" for m in models)
            sd = statistics.stdev(p50) if len(p50) > 1 else 0.0
            print(f"{pol} | {statistics.mean(p50):.0f} ± {sd:.0f} | {ratios} | {100 * success:.1f} | {100 * sla:.1f} | "
                  f"{tpot} | {share}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("backends").add_argument("config")
    c = sub.add_parser("configs")
    c.add_argument("config")
    c.add_argument("--real-out", required=True)
    c.add_argument("--sim-out")
    c.add_argument("--speedup", type=float, default=1.0, help="the sims' speedup")
    m = sub.add_parser("merge")
    m.add_argument("out")
    m.add_argument("dirs", nargs="+")
    t = sub.add_parser("table")
    t.add_argument("--real", required=True, nargs="+", help="one or more JSON lists of bench entries")
    t.add_argument("--sim", required=True, nargs="+")
    t.add_argument("--real-counters", choices=("cumulative", "per-run"), default="cumulative",
                   help="for results without worker_counters_since: the real workers' counters count from their "
                   "boot (default) or from the run's start")  # fmt: skip
    sub.add_parser("peers").add_argument("dir", help="the OUT of scripts/h200_peers.sh")
    sh = sub.add_parser("shares")
    sh.add_argument("logs", nargs="+", help="gateway request logs (JSON lines), one per boot")
    sh.add_argument("--margin", type=float, default=0.1, help="a near tie: the runner-up's cost within this fraction")
    args = p.parse_args(argv)
    cmds = {"backends": cmd_backends, "configs": cmd_configs, "merge": cmd_merge, "table": cmd_table}
    {**cmds, "shares": cmd_shares, "peers": cmd_peers}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
