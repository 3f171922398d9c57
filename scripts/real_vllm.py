"""Helpers of the real-vs-sim run (scripts/h200_validate.sh, docs/REAL_VLLM.md).

python scripts/real_vllm.py backends examples/h200-real.yaml
    one line per launch: backend — name, port, model, profile, seed (the sim seed of the twin)
python scripts/real_vllm.py configs examples/h200-real.yaml --real-out R.yaml [--sim-out S.yaml --speedup X --own-gpus
        --tokenizer wordlevel|words]
    R: the same fleet and agents, each backend's url moved to its sim-fields proxy (port + 1000)
    S: the same fleet as simulated workers (profile, the real KV budget, the same seeds); the
       backends keep their `gpu:`, so those on one GPU share one simulated GPU clock (one
       `chimera sim` process); --own-gpus drops `gpu:` and gives each its own (the first run).
       --tokenizer wordlevel (the default) gives each sim the tokenizer the real test models had
       (../shared/gpu/mkmodels.py: the bench's words are all <unk>, so real prompts hit vLLM's prefix
       cache far more than distinct words would): a copy of each profile with that `tokenizer`, in
       S's folder as <S stem>-profiles/<profile>.json; --tokenizer words keeps the shipped profiles;
       --[no-]async-scheduling sets the profiles' async_scheduling (vLLM 0.26's default, and the shipped
       profiles' since 2026-11-30; --no-async-scheduling gives the synchronous sim of earlier runs);
       --ttft-jitter-ms W their overhead_s.ttft_jitter (the request-to-request TTFT spread; docs/CALIBRATION.md);
       --prior-profiles DIR points the backends' `profile:` (the predictor's cold-start prior, not the sims)
       at DIR/<profile>.json: the profiles the real run's gateway had, when the sims' have been refitted since
python scripts/real_vllm.py bench --speedup X --config S.yaml --workload W --policy P --rate R --duration D
        --warmup W --drain T --seed N --out DIR
    `chimera bench` of the sim fleet slowed down by X (< 1: the sims at speedup X, so a loaded CPU keeps up):
    rate x X, durations / X, and the very arrival times of the run at speedup 1 (the H200's) divided by X;
    the bench seeds its Poisson draw with the rate, so a plain `--rate R*X` would be another draw
python scripts/real_vllm.py merge OUT.json DIR...       the results.json entries of several benches
python scripts/real_vllm.py table --real R.json [R2.json ...] --sim S.json [S2.json ...] [--real-counters per-run]
    TTFT, TPOT, e2e p50/p99 per policy, sim (scaled to modelled H200 time) against real, and each run's
    prefix-cache hit rate. The bench reports the workers' vLLM counters as scraped after the run, so for real
    workers (one boot for every run of h200_validate.sh) they count from the boot; the table takes each run's
    own share as the difference from the run before (runs ordered by their counters: the --real files of one
    boot, chat and mixed, together). The sims are started afresh per run: their counters are the run's own.
python scripts/real_vllm.py per-backend OUT.json [--speedup X] [--split] LABEL=GLOB...
    TPOT/TTFT p50 per worker from the gateway's request logs (x X: modelled H200 time); --split: per workload and
    policy of each request (a committed real log holds every run of a seed)
python scripts/real_vllm.py by-load OUT.json [--speedup X] [--workload W] [--of BACKEND] [--cap N] LABEL=GLOB...
    TTFT p50 per worker by how many requests were in flight at its arrival (rebuilt from the logged arrivals and
    e2e times of the same run: workload and policy), on the worker itself or, with --of, on that other worker
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from fleet_report import modelled_ms  # next to this file

PROXY_OFFSET = 1000
# The vocabulary sizes of the H200 test models (../shared/gpu/mkmodels.py, the published Qwen2.5 shapes).
VOCAB_SIZES = {"qwen2.5-0.5b": 151936, "qwen2.5-1.5b": 151936, "qwen2.5-7b": 152064, "qwen2.5-14b": 152064}


def _load(path: str) -> dict[str, Any]:
    data = yaml.safe_load(Path(path).read_text())
    assert isinstance(data, dict)
    return data


def launched(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in cfg["backends"] if b.get("launch")]


def cmd_backends(args: argparse.Namespace) -> None:
    for i, b in enumerate(launched(_load(args.config)), 1):
        port = int(b["url"].rsplit(":", 1)[1])
        print(b["name"], port, b["model"], b.get("profile", ""), i)


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
            profile = b["profile"]
            if args.tokenizer != "words" or args.async_scheduling is not None or args.ttft_jitter_ms:
                profile = derived_profile(
                    b["profile"], args.sim_out, args.tokenizer, args.async_scheduling, args.ttft_jitter_ms / 1e3
                )
            b["sim"] = {"profile": profile, "speedup": args.speedup, "seed": i, "kv_tokens": b["kv_budget_tokens"]}
            if args.prior_profiles:
                b["profile"] = str((Path(args.prior_profiles) / f"{b['profile']}.json").resolve())
            if args.own_gpus:
                b.pop("gpu", None)
        Path(args.sim_out).write_text(yaml.safe_dump(sim, sort_keys=False))


def derived_profile(
    name: str, sim_out: str, tokenizer: str, async_scheduling: bool | None, ttft_jitter_s: float = 0.0
) -> str:
    """A copy of profile ``name`` with the given tokenizer (and async scheduling when not None, TTFT jitter);
    returns its path."""
    from backends.sim.profile import PROFILE_DIR, parse_profile

    path = Path(name) if name.endswith(".json") else PROFILE_DIR / f"{name}.json"
    raw = json.loads(path.read_text())
    if tokenizer == "wordlevel":
        raw["tokenizer"] = {"kind": "wordlevel", "vocab_size": VOCAB_SIZES.get(raw["model"], 151936)}
    if async_scheduling is not None:
        raw["async_scheduling"] = async_scheduling
    if ttft_jitter_s:
        raw.setdefault("overhead_s", {})["ttft_jitter"] = ttft_jitter_s
    parse_profile(raw, source=str(path))  # still a valid profile
    out = Path(sim_out).with_name(Path(sim_out).stem + "-profiles") / f"{path.stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(raw, indent=1) + "\n")
    return str(out.resolve())


def cmd_bench(args: argparse.Namespace) -> None:
    from router.bench import client
    from router.bench.cli import run

    x = args.speedup
    h200_arrivals = client.poisson_arrivals

    def arrivals(rate: float, horizon_s: float, seed: int) -> list[float]:
        return [t / x for t in h200_arrivals(args.rate, horizon_s * x, seed)]

    client.poisson_arrivals = arrivals  # the bench looks it up at call time
    run(argparse.Namespace(
        config=args.config, workload=args.workload, policies=(args.policy,), rate=(args.rate * x,), users=None,
        duration=args.duration / x, warmup=args.warmup / x, drain=args.drain / x, seed=args.seed, seeds=None,
        out=args.out, speedup=x, no_plots=True, replicas=args.replicas, no_pin=False,
        clients=1,  # one load client: the patched arrivals above do not reach spawned client processes
    ))  # fmt: skip


def cmd_merge(args: argparse.Namespace) -> None:
    entries: list[dict[str, Any]] = []
    for d in args.dirs:
        f = Path(d) / "results.json"
        if f.exists():
            entries += json.loads(f.read_text())
    Path(args.out).write_text(json.dumps(entries, indent=1) + "\n")
    print(f"{args.out}: {len(entries)} entries")


METRICS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "e2e"))
COUNTERS = ("prefix_cache_queries", "prefix_cache_hits")


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
                raise ValueError(
                    f"{e['workload']} {e['policy']}: {w}'s counters went down since the run before; "
                    "these runs' counters are not cumulative (use --real-counters per-run)"
                )
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
    rows = ["| workload | policy | rate (wf/s, H200 time) | " + " | ".join(
        f"{label} {q} real / sim (Δ)" for _, label in METRICS for q in ("p50", "p99"))
        + " | requests real / sim | prefix-cache hit real / sim |", "|" + " --- |" * 11]  # fmt: skip
    diffs: list[tuple[str, float, str]] = []  # (metric, relative difference, policy)
    by_key = {(e["workload"], e["policy"]): e for e in sim}
    real_runs = (
        per_run_counters(real)
        if real_cumulative
        else {(e["workload"], e["policy"]): e.get("worker_counters") or {} for e in real}
    )
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
                cells.append(
                    f"{a:.0f} / {b:.0f} ({100 * d:+.0f}%)" if a >= 100 else f"{a:.1f} / {b:.1f} ({100 * d:+.0f}%)"
                )
        cells.append(f"{r['requests']} / {s['requests'] if s else '-'}")
        hr = hit_rate(real_runs.get((r["workload"], r["policy"])))
        hs = hit_rate(s.get("worker_counters") if s else None)
        cells.append(" / ".join("-" if h is None else f"{100 * h:.1f} %" for h in (hr, hs)))
        rows.append("| " + " | ".join(cells) + " |")
    return rows, diffs


def cmd_table(args: argparse.Namespace) -> None:
    real = [e for f in args.real for e in json.loads(Path(f).read_text())]
    sim = [e for f in args.sim for e in json.loads(Path(f).read_text())]
    # a bench that reports each run's own counters marks its entries (worker_counters_since: "run")
    own = all(e.get("worker_counters_since") == "run" for e in real)
    rows, diffs = table(real, sim, real_cumulative=args.real_counters == "cumulative" and not own)
    print("\n".join(rows))
    if diffs:
        within = sum(abs(d) <= 0.10 for _, d, _ in diffs)
        print(f"\n{within} of {len(diffs)} sim latencies within 10% of real; "
              f"median |Δ| {100 * sorted(abs(d) for _, d, _ in diffs)[len(diffs) // 2]:.0f}%")  # fmt: skip
        by = {"metric": [(m, d) for m, d, _ in diffs], "policy": [(p, d) for _, d, p in diffs]}
        for name, keyed in by.items():  # by policy: a policy's routing may follow the sim's timing
            counts: dict[str, list[int]] = {}
            for k, d in keyed:
                counts.setdefault(k, [0, 0])[0] += abs(d) <= 0.10
                counts[k][1] += 1
            print(f"within 10% by {name}: " + ", ".join(f"{m} {a}/{n}" for m, (a, n) in counts.items()))


def _workload(row: dict[str, Any]) -> str:
    """The bench workload of a logged request: its workflow id is ``s<seed>-<workload>-<n>``."""
    parts = str(row.get("workflow_id") or "").split("-", 1)
    return parts[1].rsplit("-", 1)[0] if len(parts) == 2 and "-" in parts[1] else "?"


def _runs(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """A log's requests by run, (workload, policy): a committed real log holds every run of a seed."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        runs.setdefault((_workload(r), r["policy"]), []).append(r)
    return runs


def _ok_requests(path: str, *needed: str) -> list[dict[str, Any]]:
    """The answered requests of a gateway request log (plain or gzipped) that carry every field in ``needed``."""
    from predictor.dataset import read_log

    return [r for r in read_log(path)[0] if r.get("outcome") == "ok" and all(r.get(k) for k in needed)]


def logs_arg(spec: str) -> tuple[str, list[str]]:
    """A ``LABEL=GLOB`` argument: the label and the request logs the pattern matches (an argparse error if none)."""
    import glob

    label, sep, pattern = spec.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"expected LABEL=GLOB, got {spec!r}")
    files = sorted(glob.glob(pattern))
    if not files:
        raise argparse.ArgumentTypeError(f"no request log matches {pattern!r}")
    return label, files


def cmd_per_backend(args: argparse.Namespace) -> None:
    import statistics

    out: dict[str, dict[str, dict[str, float]]] = {}
    for label, files in args.runs:
        for f in files:
            ok = _ok_requests(f, "tpot_s")
            if args.split:  # one key per workload and policy: a log that holds several runs
                groups = {f"{label} {workload} {policy}": run for (workload, policy), run in _runs(ok).items()}
            else:
                groups = {f"{label} {ok[0]['policy']}" if ok else label: ok}
            for key, logged in sorted(groups.items()):
                for b in sorted({r["backend"] for r in logged}):
                    mine = [r for r in logged if r["backend"] == b]
                    out.setdefault(key, {})[b] = {
                        "requests": len(mine),
                        "tpot_ms_p50": round(1000 * args.speedup * statistics.median(r["tpot_s"] for r in mine), 2),
                        "ttft_ms_p50": round(1000 * args.speedup * statistics.median(r["ttft_s"] for r in mine), 1),
                    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for key, backends in out.items():
        if args.split:
            print(key, {b: (v["ttft_ms_p50"], v["tpot_ms_p50"]) for b, v in backends.items()})
        else:
            print(key, {b: v["tpot_ms_p50"] for b, v in backends.items()})


def in_flight(run: list[dict[str, Any]], at: float, backend: str, skip: dict[str, Any] | None = None) -> int:
    """How many of one run's requests were in flight on ``backend`` at ``at`` (arrival to arrival + e2e)."""
    return sum(1 for r in run if r is not skip and r["backend"] == backend and r["ts"] <= at < r["ts"] + r["e2e_s"])


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def cmd_by_load(args: argparse.Namespace) -> None:
    import statistics

    out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for label, files in args.runs:
        buckets: dict[str, dict[str, list[float]]] = {}  # every log of the label together
        for f in files:
            for (workload, _), run in _runs(_ok_requests(f, "ttft_s", "e2e_s")).items():
                if args.workload and workload != args.workload:
                    continue
                for r in run:
                    if r["backend"] == args.of:
                        continue
                    n = in_flight(run, r["ts"], args.of or r["backend"], skip=r)
                    buckets.setdefault(r["backend"], {}).setdefault(str(min(n, args.cap)), []).append(r["ttft_s"])
        for b, by_n in sorted(buckets.items()):
            out.setdefault(label, {})[b] = {
                n: {"requests": len(v), "ttft_ms_p50": round(1000 * args.speedup * statistics.median(v), 1)}
                for n, v in sorted(by_n.items(), key=lambda kv: int(kv[0]))
            }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    on = f"on {args.of}" if args.of else "on itself"
    for label, backends in out.items():
        for b, rows in backends.items():
            cells = " ".join(f"{n}{'+' if int(n) == args.cap else ''}: {v['ttft_ms_p50']} ({v['requests']})"
                             for n, v in rows.items())  # fmt: skip
            print(f"{label} {b} TTFT p50 ms (requests) by in flight {on}: {cells}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("backends")
    b.add_argument("config")
    c = sub.add_parser("configs")
    c.add_argument("config")
    c.add_argument("--real-out", required=True)
    c.add_argument("--sim-out")
    c.add_argument("--speedup", type=float, default=1.0)
    c.add_argument("--own-gpus", action="store_true", help="sim: one GPU per worker (drop gpu:)")
    c.add_argument(
        "--tokenizer",
        choices=("wordlevel", "words"),
        default="wordlevel",
        help="sim: the real test models' word-level tokenizer (default) or the sim's own words",
    )
    c.add_argument(
        "--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
        help="sim: profiles with async_scheduling on / off (default: as the profile says; on in the shipped ones)",
    )  # fmt: skip
    c.add_argument(
        "--ttft-jitter-ms",
        type=float,
        default=0.0,
        help="sim: profiles whose TTFT constant varies evenly over this width (overhead_s.ttft_jitter)",
    )
    c.add_argument(
        "--prior-profiles",
        help="a folder of <profile>.json for the backends' profile: (the gateway's "
        "prior), e.g. the profiles the real run had; the sims keep theirs",
    )
    bn = sub.add_parser("bench", help="chimera bench of a sim fleet slowed down by --speedup, same arrivals")
    bn.add_argument("--speedup", type=float, required=True)
    bn.add_argument("--config", required=True)
    bn.add_argument("--workload", required=True)
    bn.add_argument("--policy", required=True)
    bn.add_argument("--rate", type=float, required=True, help="workflows/s in H200 time")
    bn.add_argument("--duration", type=float, required=True, help="H200 seconds (likewise --warmup, --drain)")
    bn.add_argument("--warmup", type=float, required=True)
    bn.add_argument("--drain", type=float, required=True)
    bn.add_argument("--seed", type=int, required=True)
    bn.add_argument("--replicas", type=int, default=1, help="gateway replicas (the config's state must be redis)")
    bn.add_argument("--out", required=True)
    m = sub.add_parser("merge")
    m.add_argument("out")
    m.add_argument("dirs", nargs="+")
    t = sub.add_parser("table")
    t.add_argument("--real", required=True, nargs="+", help="one or more JSON lists of bench entries")
    t.add_argument("--sim", required=True, nargs="+")
    t.add_argument(
        "--real-counters",
        choices=("cumulative", "per-run"),
        default="cumulative",
        help="the real runs' worker counters count from the workers' boot (h200_validate.sh: one boot "
        "for all its runs; default) or from the run's start",
    )
    pb = sub.add_parser("per-backend")
    pb.add_argument("out")
    pb.add_argument("--speedup", type=float, default=1.0, help="the sims' speedup (latencies x it: H200 time)")
    pb.add_argument("runs", nargs="+", type=logs_arg, help="LABEL=GLOB of request logs (.jsonl or .jsonl.gz)")
    pb.add_argument(
        "--split", action="store_true", help="key by each request's workload and policy: logs of several runs"
    )
    bl = sub.add_parser("by-load")
    bl.add_argument("out")
    bl.add_argument("--speedup", type=float, default=1.0, help="the sims' speedup (latencies x it: H200 time)")
    bl.add_argument("--workload", help="only this workload's requests (default: all)")
    bl.add_argument("--of", help="count the requests in flight on this backend (default: the request's own)")
    bl.add_argument("--cap", type=_positive_int, default=6, help="the last bucket: this many or more")
    bl.add_argument("runs", nargs="+", type=logs_arg, help="LABEL=GLOB of request logs (.jsonl or .jsonl.gz)")
    args = p.parse_args(argv)
    commands = {"backends": cmd_backends, "configs": cmd_configs, "bench": cmd_bench, "merge": cmd_merge,
                "table": cmd_table, "per-backend": cmd_per_backend, "by-load": cmd_by_load}  # fmt: skip
    commands[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
