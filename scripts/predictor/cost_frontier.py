"""Plot the measured latency / task-success frontier of ``scripts/predictor/cost_sweep.sh``.

    python scripts/predictor/cost_frontier.py logs/cost-sweep/results.json --out docs/results/pred-cost-frontier.png

One panel per rate: workflow e2e p50 (mean over seeds) against task success (mean over seeds, with
the seeds' standard deviation as error bars), the predictive rows (``predictive_w<cost>``) as one curve
labelled by ``wrong_answer_s``, round robin and least outstanding as single points. Also prints, per
rate and policy, the task success pooled over the seeds' workflows with its 95 % Wilson interval (a
run has ~30-65 workflows, so one seed's success moves by several points on its own).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

PREFIX = "predictive_w"


def _points(entries: list[dict[str, Any]]) -> dict[float, dict[str, tuple[float, float, float, float]]]:
    """rate -> policy -> (wf e2e p50 mean, its sd, success mean, its sd)."""
    cells: dict[tuple[float, str], list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        cells[(float(e["config"]["rate"]), e["policy"])].append(e)
    out: dict[float, dict[str, tuple[float, float, float, float]]] = defaultdict(dict)
    for (rate, policy), runs in cells.items():
        wf = [r["workflow_e2e_ms"]["p50"] for r in runs]
        ok = [r["task_success"] for r in runs]
        out[rate][policy] = (statistics.mean(wf), statistics.pstdev(wf), statistics.mean(ok), statistics.pstdev(ok))
    return out


def _clock(entries: list[dict[str, Any]]) -> str:
    speedups = sorted({e["config"].get("speedup", 1.0) for e in entries})
    return "wall clock" if speedups == [1.0] else "wall clock; sims at speedup " + "/".join(f"{s:g}" for s in speedups)


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of ``k`` successes in ``n`` trials."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    mid, half = p + z * z / (2 * n), z * ((p * (1 - p) + z * z / (4 * n)) / n) ** 0.5
    return (mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n)


def pooled_success(entries: list[dict[str, Any]]) -> None:
    """Markdown: rate, policy, workflows, pooled success % and its 95 % interval."""
    cells: dict[tuple[float, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in entries:
        c = cells[(float(e["config"]["rate"]), e["policy"])]
        c[0] += e["task_success"] * e["workflows"]
        c[1] += e["workflows"]
    print("| rate | policy | workflows | task success, pooled | 95 % interval |")
    print("|---|---|---|---|---|")
    for (rate, policy), (k, n) in sorted(cells.items()):
        lo, hi = wilson(k, int(n))
        print(f"| {rate:g} | {policy} | {n:.0f} | {100 * k / max(n, 1):.1f} % | {100 * lo:.1f} to {100 * hi:.1f} % |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--out", default="cost-frontier.png")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = json.loads(Path(args.results).read_text(encoding="utf-8"))
    pooled_success(entries)
    points = _points(entries)
    rates = sorted(points)
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.5), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=True):
        by = points[rate]
        curve = sorted((float(p.removeprefix(PREFIX)), v) for p, v in by.items() if p.startswith(PREFIX))
        if curve:
            xs, xerr, ys, yerr = ([v[k] for _, v in curve] for k in range(4))
            ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, marker="o", capsize=3, label="predictive (wrong_answer_s)")
            for cost, v in curve:
                ax.annotate(f"{cost:g} s", (v[0], v[2]), fontsize=8, textcoords="offset points", xytext=(4, 4))
        for policy, marker in (("round_robin", "s"), ("least_outstanding", "^")):
            if policy in by:
                x, xe, y, ye = by[policy]
                ax.errorbar([x], [y], xerr=[xe], yerr=[ye], marker=marker, capsize=3, linestyle="", label=policy)
        ax.set_title(f"{rate:g} workflows/s ({_clock(entries)})", fontsize=9)
        ax.set_xlabel("workflow e2e p50 (ms, mean over seeds)")
        ax.set_ylabel("task success (mean over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=80)
    print(args.out)


if __name__ == "__main__":
    main()
