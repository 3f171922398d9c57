"""Policies side by side from a ``chimera bench`` results.json of several seeds (docs/benchmarks.md).

    python scripts/predictor/policy_table.py logs/pred-bench-final/results.json

Per policy and load: mean ± population sd over seeds of the workflow e2e p50, task success, SLA
attainment, goodput, TTFT p99 and e2e p90; the ratio columns are round_robin's (least_outstanding's)
workflow e2e p50 ÷ this row's, per seed, then averaged (> 1: this row is faster); the model share is
the mean share of requests per model. Markdown on stdout.

``--logs DIR`` (the bench's ``logs/``) adds *strict success*: the share of the logged workflows whose
final check passed an answer that was itself ``[correct]`` — the bench's ``task_success`` also counts
a checker's false pass (``[correct]`` on a ``[wrong]`` answer) as a success.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def _ms(values: list[float], digits: int = 0) -> str:
    sd = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def strict_success(log: Path) -> float | None:
    """Share of the log's workflows whose last answer is a check passing a ``[correct]`` answer."""
    requests: list[dict[str, Any]] = []
    scores: dict[str, float] = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        if d.get("type") == "feedback":
            scores[d["request_id"]] = d["score"]
        elif d.get("endpoint") and d.get("workflow_id"):
            requests.append(d)
    flows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(requests, key=lambda r: r["ts"]):
        flows[r["workflow_id"]].append(r)
    ok = [len(f) > 1 and scores.get(f[-1]["request_id"]) == 1.0 and scores.get(f[-2]["request_id"]) == 1.0
          for f in flows.values()]  # fmt: skip
    return sum(ok) / len(ok) if ok else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--logs", type=Path, help="the bench's logs/ directory: add a strict-success column")
    args = ap.parse_args()
    with open(args.results, encoding="utf-8") as f:
        entries: list[dict[str, Any]] = json.load(f)
    cells: dict[tuple[str, float], dict[int, dict[str, Any]]] = defaultdict(dict)
    for e in entries:
        cells[(e["policy"], float(e["config"]["rate"]))][int(e["config"]["seed"])] = e
    models = sorted({m for e in entries for m in e.get("model_share") or {}})
    print("| policy | rate | seeds | req | wf e2e p50 (ms) | round_robin ÷ this | least_outstanding ÷ this "
          f"| success % | SLA % | goodput rps | TTFT p99 | e2e p90 | model share % {' / '.join(models)} |"
          + (" strict success % |" if args.logs else ""))  # fmt: skip
    print("|---" * (14 if args.logs else 13) + "|")
    for (policy, rate), by_seed in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        seeds = sorted(by_seed)
        wf = [by_seed[s]["workflow_e2e_ms"]["p50"] for s in seeds]
        ratios = []
        for base in ("round_robin", "least_outstanding"):
            ref = cells.get((base, rate), {})
            r = [ref[s]["workflow_e2e_ms"]["p50"] / by_seed[s]["workflow_e2e_ms"]["p50"] for s in seeds if s in ref]
            ratios.append(_ms(r, 2) + "\u00d7" if r else "—")
        share = [statistics.mean(by_seed[s].get("model_share", {}).get(m, 0.0) for s in seeds) for m in models]
        req = sum(by_seed[s]["requests"] for s in seeds) / len(seeds)
        print(f"| {policy} | {rate:g} | {len(seeds)} | {req:.0f} | {_ms(wf)} | {ratios[0]} | {ratios[1]} "
              f"| {_ms([100 * by_seed[s]['task_success'] for s in seeds], 1)} "
              f"| {_ms([100 * by_seed[s]['sla_attainment'] for s in seeds], 1)} "
              f"| {_ms([by_seed[s]['goodput_rps'] for s in seeds], 2)} "
              f"| {_ms([by_seed[s]['ttft_ms']['p99'] for s in seeds])} "
              f"| {_ms([by_seed[s]['e2e_ms']['p90'] for s in seeds])} "
              f"| {'/'.join(f'{100 * x:.0f}' for x in share)} |", end="")  # fmt: skip
        if args.logs:
            strict = [strict_success(args.logs / f"requests-{policy}-rate{rate:g}-s{s}.jsonl") for s in seeds]
            print(f" {_ms([100 * x for x in strict if x is not None], 1)} |", end="")
        print()


if __name__ == "__main__":
    main()
