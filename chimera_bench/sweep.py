"""`chimera bench … --costs W1,W2,…`: the predictive policy's latency / task-success trade-off, measured.

``gateway.policy_options.wrong_answer_s`` prices a wrong answer (its retry) in modelled seconds: the
predictive policy takes the worker with the least predicted e2e + P(wrong) x that cost (0: Chimera's
slack rule alone). With ``--costs`` the bench runs every other policy of ``--policies`` once, on the
config as it is, then ``predictive`` once per cost, on a copy of the config with that cost
(``DIR/configs/w<cost>.yaml``), all over the same seeded workload::

    chimera bench --config examples/bench-hetero-learned.yaml --workload mixed \\
        --policies round_robin,least_outstanding,predictive --costs 0,3,6,12,24 \\
        --rate 2,4 --seeds 1,2,3 --speedup 0.25 --duration 15 --warmup 3 --drain 40 --out logs/cost-sweep

``DIR/results.json`` holds every run, the predictive ones named ``predictive_w<cost>`` (each run's own
files are in ``DIR/baselines/`` and ``DIR/w<cost>/``). It prints the bench's table and, per load and
policy, the task success pooled over the seeds' workflows with its 95 % Wilson interval (a run has a few
dozen workflows, so one seed's success moves by several points on its own); unless ``--no-plots`` it
draws ``DIR/cost_frontier.png``: per load, workflow e2e p50 against task success (means over seeds, their
standard deviations as error bars), the costs as one curve, the other policies as points.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from chimera_bench import report
from chimera_bench.runner import BenchSpec, run_bench
from router.core.errors import ConfigError

SWEPT = "predictive"
PREFIX = f"{SWEPT}_w"


def check(policies: Sequence[str], costs: Sequence[float], workload: str) -> None:
    """ConfigError (exit 2) for a sweep that cannot run."""
    if workload == "overhead":
        raise ConfigError("the overhead workload has no policies to sweep", key="--costs")
    if SWEPT not in policies:
        raise ConfigError(f"--costs sweeps the {SWEPT} policy's wrong_answer_s: add {SWEPT} to --policies",
                          key="--costs")  # fmt: skip
    if not all(c >= 0 and math.isfinite(c) for c in costs):
        raise ConfigError("every cost must be a number of seconds not below 0", key="--costs")
    if len(set(costs)) != len(costs):
        raise ConfigError("the costs repeat", key="--costs")


def run_sweep(spec: BenchSpec, costs: Sequence[float]) -> list[dict[str, Any]]:
    """The other policies once, then the predictive one per cost; every entry in ``spec.out``/results.json."""
    check(spec.policies, costs, spec.workload)
    out = Path(spec.out)
    entries: list[dict[str, Any]] = []

    def save() -> None:
        (out / "results.json").write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")

    others = tuple(p for p in spec.policies if p != SWEPT)
    if others:
        entries += run_bench(replace(spec, policies=others, out=str(out / "baselines"), plots=False))
        save()
    for cost in costs:
        config = cost_config(spec.config_path, cost, out / "configs" / f"w{cost:g}.yaml")
        runs = run_bench(replace(spec, config_path=str(config), policies=(SWEPT,), out=str(out / f"w{cost:g}"),
                                 plots=False))  # fmt: skip
        entries += [{**e, "policy": f"{PREFIX}{cost:g}", "wrong_answer_s": cost} for e in runs]
        save()
    print("\n".join(pooled_success(entries)))
    from rich.console import Console

    speedups = {float(e["config"]["speedup"]) for e in entries}
    wide = None if Console().is_terminal else Console(width=220)  # (as the bench prints its own table)
    report.print_table(entries, console=wide, speedup=speedups.pop() if len(speedups) == 1 else 1.0)
    if spec.plots:
        plot_frontier(entries, out / "cost_frontier.png")
    return entries


def cost_config(config_path: str, cost: float, path: Path) -> Path:
    """A copy of the config with ``gateway.policy_options.wrong_answer_s`` set to ``cost``."""
    data = yaml.safe_load(Path(config_path).read_text(encoding="utf-8"))
    gateway = data.setdefault("gateway", {})
    gateway["policy_options"] = {**(gateway.get("policy_options") or {}), "wrong_answer_s": cost}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of ``k`` successes in ``n`` trials."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    mid, half = p + z * z / (2 * n), z * ((p * (1 - p) + z * z / (4 * n)) / n) ** 0.5
    return (mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n)


def pooled_success(entries: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown rows: load, policy, workflows, task success pooled over the seeds' workflows, its interval."""
    rows = ["| load | policy | workflows | task success, pooled | 95 % interval |", "|---|---|---|---|---|"]
    for (policy, kind, load), group in sorted(report.grouped(entries).items(), key=lambda kv: (kv[0][2], kv[0][0])):
        n = sum(int(e["workflows"]) for e in group)
        k = sum((e["task_success"] or 0.0) * e["workflows"] for e in group)  # (None: no workflow finished)
        lo, hi = wilson(k, n)
        rows.append(f"| {kind}={load:g} | {policy} | {n} | {100 * k / max(n, 1):.1f} % | "
                    f"{100 * lo:.1f} to {100 * hi:.1f} % |")  # fmt: skip
    return rows


def _points(entries: Sequence[dict[str, Any]]) -> dict[tuple[str, float], dict[str, tuple[float, ...]]]:
    """(kind, load) -> policy -> (wf e2e p50 mean, its sd, success mean, its sd) over the seeds."""
    out: dict[tuple[str, float], dict[str, tuple[float, ...]]] = defaultdict(dict)
    for (policy, kind, load), runs in report.grouped(entries).items():
        wf = [r["workflow_e2e_ms"]["p50"] for r in runs if r["workflow_e2e_ms"]["p50"] is not None]
        ok = [r["task_success"] for r in runs if r["task_success"] is not None]
        if wf and ok:
            out[(kind, load)][policy] = (statistics.mean(wf), statistics.pstdev(wf), statistics.mean(ok),
                                         statistics.pstdev(ok))  # fmt: skip
    return out


def plot_frontier(entries: Sequence[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = _points(entries)
    loads = sorted(points, key=lambda kl: kl[1])
    speedups = sorted({float(e["config"].get("speedup", 1.0)) for e in entries})
    clock = "wall clock" + ("" if speedups == [1.0] else "; sims at speedup " + "/".join(f"{s:g}" for s in speedups))
    fig, axes = plt.subplots(1, max(1, len(loads)), figsize=(6 * max(1, len(loads)), 4.5), squeeze=False)
    for ax, (kind, load) in zip(axes[0], loads, strict=False):
        by = points[(kind, load)]
        curve = sorted((float(p.removeprefix(PREFIX)), v) for p, v in by.items() if p.startswith(PREFIX))
        if curve:
            xs, xerr, ys, yerr = ([v[k] for _, v in curve] for k in range(4))
            ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, marker="o", capsize=3, label=f"{SWEPT} (wrong_answer_s)")
            for cost, v in curve:
                ax.annotate(f"{cost:g} s", (v[0], v[2]), fontsize=8, textcoords="offset points", xytext=(4, 4))
        for policy, (x, xe, y, ye) in sorted(by.items()):
            if not policy.startswith(PREFIX):
                ax.errorbar([x], [y], xerr=[xe], yerr=[ye], marker="s", capsize=3, linestyle="", label=policy)
        ax.set_title(f"{kind}={load:g} ({clock})", fontsize=9)
        ax.set_xlabel("workflow e2e p50 (ms, mean over seeds)")
        ax.set_ylabel("task success (mean over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
