"""The bench's table (rich) and plots (matplotlib, Agg): seeds averaged per policy and load point."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _load_of(e: dict[str, Any]) -> tuple[str, float]:
    return ("users", float(e["users"])) if "users" in e else ("rate", float(e["rate"]))


def grouped(entries: Sequence[dict[str, Any]]) -> dict[tuple[str, str, float], list[dict[str, Any]]]:
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for e in entries:
        groups.setdefault((e["policy"], *_load_of(e)), []).append(e)
    return groups


def _get(e: dict[str, Any], path: str) -> float | None:
    node: Any = e
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return float(node) if isinstance(node, int | float) else None


def mean_of(group: Sequence[dict[str, Any]], path: str) -> float | None:
    vals = [v for e in group if (v := _get(e, path)) is not None]
    return float(np.mean(vals)) if vals else None


def spread_of(group: Sequence[dict[str, Any]], path: str) -> float | None:
    vals = [v for e in group if (v := _get(e, path)) is not None]
    return float(np.std(vals)) if len(vals) > 1 else None


COLUMNS = (  # header, path, format
    ("rps", "throughput_rps", "{:.2f}"),
    ("tok/s", "output_tok_per_s", "{:.0f}"),
    ("TTFT p50", "ttft_ms.p50", "{:.0f}"),
    ("TTFT p99", "ttft_ms.p99", "{:.0f}"),
    ("e2e p90", "e2e_ms.p90", "{:.0f}"),
    ("wf e2e p50", "workflow_e2e_ms.p50", "{:.0f}"),
    ("SLA", "sla_attainment", "{:.1%}"),
    ("goodput", "goodput_rps", "{:.2f}"),
    ("success", "task_success", "{:.1%}"),
    ("strict", "task_success_strict", "{:.1%}"),
    ("prefix hit", "prefix_cache_hit_rate", "{:.1%}"),
)


def print_table(entries: Sequence[dict[str, Any]], *, console: Any = None, speedup: float = 1.0) -> None:
    from rich.console import Console
    from rich.table import Table

    note = f" — sims at speedup {speedup:g}: latencies in wall ms (x{speedup:g} = H200 time)" if speedup != 1 else ""
    table = Table(title=f"chimera bench (mean over seeds; ± std){note}", title_justify="left")
    for h in ("policy", "load", "seeds", "req", "err", *(c[0] for c in COLUMNS), "peak KV"):
        table.add_column(h, justify="left" if h in ("policy", "load") else "right")
    for (policy, kind, load), group in grouped(entries).items():
        cells = []
        for _, path, fmt in COLUMNS:
            m, s = mean_of(group, path), spread_of(group, path)
            cell = "-" if m is None else fmt.format(m)
            if s is not None and s > 0 and "%" not in fmt:
                cell += " ±" + fmt.format(s)
            elif s is not None and s > 0:
                cell += f" ±{100 * s:.1f}"
            cells.append(cell)
        peak = max((max(e.get("peak_kv_usage", {}).values(), default=0.0) for e in group), default=0.0)
        table.add_row(policy, f"{kind}={load:g}", str(len(group)), str(sum(e["requests"] for e in group)),
                      str(sum(e["errors"] for e in group)), *cells, f"{peak:.0%}")  # fmt: skip
    (console or Console()).print(table)


def plot_all(
    entries: Sequence[dict[str, Any]], raw: dict[str, dict[str, list[float]]], out: Path, *, speedup: float
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    note = f"sims at speedup {speedup:g}: wall-clock = H200 time / {speedup:g}" if speedup != 1 else "wall clock"
    return [_cdfs(raw, out, note), _sla_vs_load(entries, out, note), _frontier(entries, out, note)]


def _cdfs(raw: dict[str, dict[str, list[float]]], out: Path, note: str) -> Path:
    import matplotlib.pyplot as plt

    loads = sorted({k.split("|", 1)[1] for k in raw}, key=lambda s: float(s.split("=")[1]))
    metrics = ("ttft_ms", "e2e_ms", "workflow_e2e_ms")
    fig, axes = plt.subplots(len(loads), 3, figsize=(13, 3.2 * len(loads)), squeeze=False)
    for row, load in enumerate(loads):
        for col, metric in enumerate(metrics):
            ax = axes[row][col]
            for key, series in sorted(raw.items()):
                policy, at = key.split("|", 1)
                vals = np.sort(np.asarray(series.get(metric, []), dtype=float))
                if at != load or not vals.size:
                    continue
                ax.plot(vals, np.arange(1, vals.size + 1) / vals.size, label=policy)
            ax.set_xscale("log")
            ax.set_title(f"{metric} CDF, {load}", fontsize=9)
            ax.set_xlabel("ms")
            ax.grid(alpha=0.3)
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    fig.suptitle(f"Latency CDFs per policy (all seeds pooled) — {note}", fontsize=10)
    fig.tight_layout()
    path = out / "latency_cdf.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _sla_vs_load(entries: Sequence[dict[str, Any]], out: Path, note: str) -> Path:
    import matplotlib.pyplot as plt

    groups = grouped(entries)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    kind = next(iter(groups))[1] if groups else "rate"
    for policy in sorted({p for p, _, _ in groups}):
        pts = sorted((load, g) for (p, _, load), g in groups.items() if p == policy)
        xs = [x for x, _ in pts]
        for ax, metric in zip(axes, ("sla_attainment", "goodput_rps"), strict=True):
            ys = [mean_of(g, metric) or 0.0 for _, g in pts]
            errs = [spread_of(g, metric) or 0.0 for _, g in pts]
            ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=policy)
    axes[0].set_ylabel("SLA attainment (share of requests)")
    axes[1].set_ylabel("goodput (requests/s meeting SLA)")
    for ax in axes:
        ax.set_xlabel(f"{kind} ({'workflows/s, wall clock' if kind == 'rate' else 'closed-loop users'})")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"SLA attainment and goodput vs load (mean ± std over seeds) — {note}", fontsize=10)
    fig.tight_layout()
    path = out / "sla_vs_rate.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _frontier(entries: Sequence[dict[str, Any]], out: Path, note: str) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    groups = grouped(entries)
    for policy in sorted({p for p, _, _ in groups}):
        pts = sorted((load, g) for (p, _, load), g in groups.items() if p == policy)
        xs = [mean_of(g, "workflow_e2e_ms.p50") or np.nan for _, g in pts]
        ys = [mean_of(g, "task_success") or np.nan for _, g in pts]
        ax.plot(xs, ys, marker="o", label=policy)
        for (load, _), x, y in zip(pts, xs, ys, strict=True):
            ax.annotate(f"{load:g}", (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax.set_xlabel("workflow e2e p50 (ms)")
    ax.set_ylabel("task success (share of workflows)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Latency vs task success (points labelled by load)\n{note}", fontsize=9)
    fig.tight_layout()
    path = out / "frontier.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def markdown_table(entries: Sequence[dict[str, Any]]) -> str:
    """The table as Markdown (mean over seeds, ± std), for docs."""
    heads = ["policy", "load", "seeds", "req", "err", *(c[0] for c in COLUMNS), "peak KV"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for (policy, kind, load), group in grouped(entries).items():
        cells = []
        for _, path, fmt in COLUMNS:
            m, s = mean_of(group, path), spread_of(group, path)
            pct = "%" in fmt
            cell = "-" if m is None else (f"{100 * m:.1f}" if pct else fmt.format(m))
            if s:
                cell += f" ± {100 * s:.1f}" if pct else " ± " + fmt.format(s)
            cells.append(cell)
        peak = max((max(e.get("peak_kv_usage", {}).values(), default=0.0) for e in group), default=0.0)
        row = [policy, f"{kind}={load:g}", str(len(group)), str(sum(e["requests"] for e in group)),
               str(sum(e["errors"] for e in group)), *cells, f"{100 * peak:.0f}"]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def by_length(out: Path, long_tokens: int = 2048) -> str:
    """Short vs long requests (prompt < / >= ``long_tokens``) from a bench's gateway request logs:
    TTFT and TPOT quantiles as the gateway saw them (warm-up included)."""
    import json

    rows = [json.loads(line) for f in sorted((out / "logs").glob("requests-*.jsonl")) for line in f.open()]
    rows = [r for r in rows if r.get("status") == 200 and r.get("ttft_s") is not None]
    parts = []
    for name, is_long in (("short", False), ("long", True)):
        group = [r for r in rows if (r["prompt_tokens"] >= long_tokens) == is_long]
        ttft = [r["ttft_s"] * 1000 for r in group]
        tpot = [(r["e2e_s"] - r["ttft_s"]) * 1000 / (r["completion_tokens"] - 1)
                for r in group if (r.get("completion_tokens") or 0) > 1]  # fmt: skip
        if not ttft or not tpot:
            continue
        t, p = np.percentile(ttft, [50, 90, 99]), np.percentile(tpot, [50, 90, 99])
        parts.append(f"{name}: n={len(group)} TTFT p50/p90/p99 {t[0]:.0f}/{t[1]:.0f}/{t[2]:.0f} ms, "
                     f"TPOT p50/p90/p99 {p[0]:.1f}/{p[1]:.1f}/{p[2]:.1f} ms")  # fmt: skip
    return " | ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chimera_bench.report DIR [--markdown] [--plots] [--by-length]``: reprint a finished bench."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m chimera_bench.report")
    p.add_argument("dir")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--plots", action="store_true")
    p.add_argument("--by-length", action="store_true", help="short vs long requests from the request logs")
    args = p.parse_args(argv)
    out = Path(args.dir)
    if not (out / "results.json").is_file():
        print(f"{out}: no results.json here (the --out of a chimera bench run)", file=sys.stderr)
        return 2
    if args.by_length:
        print(by_length(out))
        return 0
    entries = json.loads((out / "results.json").read_text(encoding="utf-8"))
    speedup = float(entries[0].get("config", {}).get("speedup", 1.0)) if entries else 1.0
    print(markdown_table(entries)) if args.markdown else print_table(entries, speedup=speedup)
    if args.plots:
        plot_all(entries, json.loads((out / "latencies.json").read_text(encoding="utf-8")), out, speedup=speedup)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
