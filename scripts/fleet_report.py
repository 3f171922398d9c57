"""Tables from `chimera bench` results of several seeds and rates: policies side by side, and sim against real.

    python scripts/fleet_report.py policies docs/results/real-h200-x2/real-mixed.json
    python scripts/fleet_report.py simreal --real docs/results/real-h200-x2/real-mixed.json \\
        --sim docs/results/real-h200-x2/sim-mixed.json
    python scripts/fleet_report.py gateway --real 'REAL_RUNS/*/logs' --sim 'SIM_RUNS/*/logs' --speedup 0.25
    python scripts/fleet_report.py layers RESULTS.json 'RUNS/*/logs'

``layers`` splits one side's TTFT per worker: the engine's own (vLLM's ``time_to_first_token_seconds``
histogram over the run, from ``worker_counters``; percentiles interpolated within its buckets) against the
gateway's (request logs: receipt to first chunk), so what lies between them (routing, the HTTP hops, vLLM's
API server before it stamps the request's arrival) shows apart from the engine.

``gateway`` reads the gateways' request logs (``requests-*.jsonl``) instead of the client's view: TTFT from a
request's receipt to its first chunk, per model and prompt length, over the runs (policy, rate, seed) found on
both sides, warm-up left out, so the load client's own queue and the client-to-gateway hop are out of the
comparison (the sims' logs are in wall time: ``--speedup`` scales them back).

Rates and latencies are put in modelled (H200) time first: a sim run at ``speedup`` s ran its load at
``rate`` wall-clock workflows/s = ``rate / s`` modelled, and its wall-clock latencies are ``1/s`` times
the modelled ones. Cells are the mean over the seeds present on both sides (± the standard deviation
over seeds in the policy table).
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

METRICS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "e2e"), ("workflow_e2e_ms", "wf e2e"))


def _speedup(e: dict[str, Any]) -> float:
    return float((e.get("config") or {}).get("speedup", 1.0))


def _rate(e: dict[str, Any]) -> float:
    return round(float(e["rate"]) / _speedup(e), 3)


def modelled_ms(e: dict[str, Any], key: str, q: str) -> float | None:
    """Percentile ``q`` of latency ``key`` of one bench entry, in modelled (H200) time."""
    v = (e.get(key) or {}).get(q)
    return None if v is None else float(v) * _speedup(e)


def _groups(entries: list[dict[str, Any]]) -> dict[tuple[str, float], dict[int, dict[str, Any]]]:
    g: dict[tuple[str, float], dict[int, dict[str, Any]]] = defaultdict(dict)
    for e in entries:
        g[(e["policy"], _rate(e))][int(e.get("seed", 0))] = e
    return g


def _ms(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def policies(entries: list[dict[str, Any]]) -> list[str]:
    g = _groups(entries)
    rows = ["| rate (wf/s) | policy | seeds | wf e2e p50 (ms) | RR ÷ this | LO ÷ this | e2e p50 | TTFT p50 | "
            "TTFT p99 | success % | SLA % | model share |", "|" + " --- |" * 12]  # fmt: skip
    for rate in sorted({r for _, r in g}):
        base = {p: g.get((p, rate), {}) for p in ("round_robin", "least_outstanding")}
        for (pol, r), by_seed in sorted(g.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            if r != rate:
                continue
            seeds = sorted(by_seed)

            def stat(vals: list[float], pct: bool = False) -> str:
                k = 100.0 if pct else 1.0
                m = statistics.mean(vals) * k
                return f"{_ms(m)} ± {_ms(statistics.stdev(vals) * k)}" if len(vals) > 1 else _ms(m)

            wf = [modelled_ms(by_seed[s], "workflow_e2e_ms", "p50") or 0.0 for s in seeds]
            ratios = []
            for b in ("round_robin", "least_outstanding"):
                common = [s for s in seeds if s in base[b]]
                rs = [(modelled_ms(base[b][s], "workflow_e2e_ms", "p50") or 0.0)
                      / (modelled_ms(by_seed[s], "workflow_e2e_ms", "p50") or 1.0) for s in common]  # fmt: skip
                ratios.append(f"{statistics.mean(rs):.2f} ± {statistics.stdev(rs):.2f}" if len(rs) > 1 else
                              (f"{rs[0]:.2f}" if rs else "-"))  # fmt: skip
            share: dict[str, float] = defaultdict(float)
            for s in seeds:
                for m, v in (by_seed[s].get("model_share") or {}).items():
                    share[m] += v / len(seeds)
            rows.append("| " + " | ".join([
                f"{rate:g}", pol, str(len(seeds)), stat(wf), *ratios,
                stat([modelled_ms(by_seed[s], "e2e_ms", "p50") or 0.0 for s in seeds]),
                stat([modelled_ms(by_seed[s], "ttft_ms", "p50") or 0.0 for s in seeds]),
                stat([modelled_ms(by_seed[s], "ttft_ms", "p99") or 0.0 for s in seeds]),
                stat([by_seed[s]["task_success"] for s in seeds], pct=True),
                stat([by_seed[s]["sla_attainment"] for s in seeds], pct=True),
                " / ".join(f"{m.removeprefix('qwen2.5-')} {100 * v:.0f}%" for m, v in sorted(share.items())),
            ]) + " |")  # fmt: skip
    return rows


def simreal(real: list[dict[str, Any]], sim: list[dict[str, Any]]) -> tuple[list[str], list[float]]:
    gr, gs = _groups(real), _groups(sim)
    heads = [f"{label} {q}" for _, label in METRICS for q in ("p50", "p99")]
    rows = ["| rate (wf/s) | policy | seeds | " + " | ".join(f"{h} real / sim (Δ)" for h in heads) + " |",
            "|" + " --- |" * (3 + len(heads))]  # fmt: skip
    diffs: list[float] = []
    for (pol, rate), rs in sorted(gr.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ss = gs.get((pol, rate), {})
        seeds = sorted(set(rs) & set(ss))
        cells = [f"{rate:g}", pol, ",".join(map(str, seeds)) or "-"]
        for key, _ in METRICS:
            for q in ("p50", "p99"):
                a_vals = [v for s in seeds if (v := modelled_ms(rs[s], key, q)) is not None]
                b_vals = [v for s in seeds if (v := modelled_ms(ss[s], key, q)) is not None]
                if not a_vals or not b_vals:
                    cells.append("-")
                    continue
                a, b = statistics.mean(a_vals), statistics.mean(b_vals)
                d = (b - a) / a if a else 0.0
                diffs.append(d)
                mark = "**" if abs(d) <= 0.10 else ""
                cells.append(f"{mark}{_ms(a)} / {_ms(b)} ({100 * d:+.0f}%){mark}")
        rows.append("| " + " | ".join(cells) + " |")
    return rows, diffs


BUCKETS = (0, 500, 1000, 2000, 4000)  # prompt tokens: the lower edges of the gateway table's rows
_Run = tuple[str, float, int]  # (policy, modelled rate, seed)


def _request_logs(pattern: str) -> Iterator[tuple[str, float, int, dict[str, Any]]]:
    """(policy, rate as run, seed, record) of every answered streamed request in the request logs
    (``requests-<policy>-rate<r>-s<seed>-r<k>.jsonl``) under the folders ``pattern`` matches."""
    for folder in glob.glob(pattern):
        for f in Path(folder).glob("requests-*-rate*-s*-r*.jsonl"):
            policy, _, rest = f.stem.removeprefix("requests-").rpartition("-rate")
            rate, _, rest = rest.partition("-s")
            seed = int(rest.partition("-r")[0])
            for line in f.read_text().splitlines():
                r = json.loads(line) if line.strip().endswith("}") else {}  # a truncated last line is skipped
                if r.get("ttft_s") is not None and r.get("outcome") == "ok":
                    yield policy, float(rate), seed, r


def _gateway_runs(pattern: str, speedup: float, warmup_s: float) -> dict[_Run, list[dict[str, Any]]]:
    """Each run's answered streamed requests (:func:`_request_logs`) after its warm-up (modelled seconds from
    its first request), TTFT in modelled ms."""
    runs: dict[_Run, list[dict[str, Any]]] = defaultdict(list)
    for policy, rate, seed, r in _request_logs(pattern):
        if r.get("prompt_tokens") is not None:
            runs[(policy, round(rate / speedup, 3), seed)].append(
                {"ts": r["ts"], "model": str(r.get("model")), "prompt": r["prompt_tokens"],
                 "inflight": (r.get("fleet") or {}).get("inflight_requests", 0), "ttft": 1e3 * r["ttft_s"] * speedup}
            )  # fmt: skip
    for key, reqs in runs.items():
        start = min((r["ts"] for r in reqs), default=0.0) + warmup_s / speedup
        runs[key] = [r for r in reqs if r["ts"] >= start]
    return runs


INFLIGHT = (0, 3, 6, 9, 12)  # the worker's requests in flight at dispatch (this gateway's): the rows of --by inflight


def gateway(
    real: str, sim: str, speedup: float, warmup_s: float, by: str = "prompt", min_n: int = 20
) -> tuple[list[str], list[float]]:
    """TTFT p50 / p90 per (model, prompt-length or in-flight bucket) over the runs present on both sides."""
    a, b = _gateway_runs(real, 1.0, warmup_s), _gateway_runs(sim, speedup, warmup_s)
    both = sorted(set(a) & set(b))
    if not both:
        raise SystemExit(f"no run is in both {real!r} ({len(a)} runs) and {sim!r} ({len(b)} runs)")
    cells: dict[tuple[str, int], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    edges, field = (BUCKETS, "prompt") if by == "prompt" else (INFLIGHT, "inflight")
    for side, runs in ((0, a), (1, b)):
        for key in both:
            for r in runs[key]:
                cells[(r["model"], max(x for x in edges if r[field] >= x))][side].append(r["ttft"])
    rows = [f"runs in both: {len(both)} ({', '.join(sorted({k[0] for k in both}))}; rates "
            f"{', '.join(f'{x:g}' for x in sorted({k[1] for k in both}))}; seeds {sorted({k[2] for k in both})})", "",
            f"| model | {'prompt tokens' if by == 'prompt' else 'in flight at dispatch'} | requests real / sim | "
            "TTFT p50 real / sim (Δ) | TTFT p90 real / sim (Δ) |",
            "|" + " --- |" * 5]  # fmt: skip
    diffs: list[float] = []
    for (model, bucket), (ra, rb) in sorted(cells.items()):
        if min(len(ra), len(rb)) < min_n:
            continue  # too few for a p90
        nxt = [x for x in edges if x > bucket]
        row = [model, f"{bucket:,} to {nxt[0] - 1:,}" if nxt else f"≥ {bucket:,}", f"{len(ra)} / {len(rb)}"]
        for q in (0.5, 0.9):
            x, y = statistics.quantiles(ra, n=10)[int(10 * q) - 1], statistics.quantiles(rb, n=10)[int(10 * q) - 1]
            d = (y - x) / x if x > 0 else 0.0
            diffs.append(d)
            row.append(f"{_ms(x)} / {_ms(y)} ({100 * d:+.0f}%)")
        rows.append("| " + " | ".join(row) + " |")
    return rows, diffs


def _hist_quantile(counters: dict[str, float], q: float) -> float | None:
    """Quantile ``q`` (s) of the ``ttft_le_<bound>`` cumulative buckets, linear within a bucket."""
    bounds = sorted((float(k[8:]), v) for k, v in counters.items() if k.startswith("ttft_le_"))
    if not bounds or bounds[-1][1] <= 0:
        return None
    target, lo, below = q * bounds[-1][1], 0.0, 0.0
    for hi, cum in bounds:
        if cum >= target:
            return lo if hi == float("inf") else lo + (hi - lo) * (target - below) / max(cum - below, 1e-12)
        lo, below = hi, cum
    return lo


def layers(entries: list[dict[str, Any]], logs: str) -> list[str]:
    rows = ["| rate | policy | seed | worker | requests | engine TTFT mean / p50 / p90 (ms) | "
            "gateway TTFT mean / p50 / p90 (ms) | gateway minus engine, mean (ms) |", "|" + " --- |" * 8]  # fmt: skip
    gw: dict[tuple[str, float, int, str], list[float]] = defaultdict(list)
    for policy, rate, seed, r in _request_logs(logs):
        gw[(policy, rate, seed, str(r.get("backend")))].append(1e3 * float(r["ttft_s"]))
    for e in sorted(entries, key=lambda e: (_rate(e), e["policy"], e.get("seed", 0))):
        for worker, c in sorted((e.get("worker_counters") or {}).items()):
            n = c.get("ttft_count", 0.0)
            g = sorted(gw.get((e["policy"], float(e["rate"]), int(e.get("seed", 0)), worker), []))
            if n <= 0 or not g:
                continue
            sp = _speedup(e)
            eng = [1e3 * c["ttft_sum"] / n * sp] + [1e3 * (_hist_quantile(c, q) or 0.0) * sp for q in (0.5, 0.9)]
            gate = [statistics.mean(g) * sp, g[len(g) // 2] * sp, g[int(0.9 * (len(g) - 1))] * sp]
            rows.append(f"| {_rate(e):g} | {e['policy']} | {e.get('seed', 0)} | {worker} | {int(n)} | "
                        f"{' / '.join(_ms(x) for x in eng)} | {' / '.join(_ms(x) for x in gate)} | "
                        f"{gate[0] - eng[0]:+.1f} |")  # fmt: skip
    if len(rows) == 2:
        raise SystemExit("no run has both the engine's TTFT histogram (worker_counters) and request logs")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("policies")
    p.add_argument("file")
    s = sub.add_parser("simreal")
    s.add_argument("--real", required=True)
    s.add_argument("--sim", required=True)
    g = sub.add_parser("gateway")
    g.add_argument("--real", required=True, help="a glob of the real runs' log folders")
    g.add_argument("--sim", required=True, help="a glob of the sim runs' log folders")
    g.add_argument("--speedup", type=float, required=True, help="the sims' speedup")
    g.add_argument("--warmup", type=float, default=4.0, help="modelled seconds left out at each run's start")
    g.add_argument(
        "--by",
        choices=("prompt", "inflight"),
        default="prompt",
        help="rows: prompt length, or the worker's requests in flight at dispatch",
    )
    y = sub.add_parser("layers")
    y.add_argument("file", help="bench results with worker_counters")
    y.add_argument("logs", help="a glob of the same runs' log folders")
    args = ap.parse_args(argv)
    if args.cmd == "policies":
        print("\n".join(policies(json.loads(Path(args.file).read_text()))))
        return 0
    if args.cmd == "layers":
        print("\n".join(layers(json.loads(Path(args.file).read_text()), args.logs)))
        return 0
    if args.cmd == "gateway":
        rows, diffs = gateway(args.real, args.sim, args.speedup, args.warmup, args.by)
    else:
        rows, diffs = simreal(json.loads(Path(args.real).read_text()), json.loads(Path(args.sim).read_text()))
    print("\n".join(rows))
    if diffs:
        ad = sorted(abs(d) for d in diffs)
        print(f"\n{sum(d <= 0.10 for d in ad)} of {len(ad)} cells within 10 %, {sum(d <= 0.20 for d in ad)} within "
              f"20 %; median |Δ| {100 * ad[len(ad) // 2]:.0f} %")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
