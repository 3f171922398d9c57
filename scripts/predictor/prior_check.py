"""How well the analytic prior's TTFT p50 follows request logs, per model and load (no training).

    python scripts/predictor/prior_check.py LOG.jsonl[.gz] ...

For every usable request line (``predictor.dataset``: its worker's state at dispatch, its profile, its
measured TTFT) this recomputes ``predictor.prior.prior_latency`` and prints, per model and for the worker
idle (load 0) or busy: the measured and predicted TTFT p50, the median measured / predicted ratio, the
p50 MAPE, the MAPE after scaling by that ratio (what the policy's per-worker latency feedback can take
out, ``ttft_bias``) and Spearman's rank correlation. Uses only what every prior version has, so two code
versions can score the same logs (``PYTHONPATH=<checkout>``, run from outside either checkout; a checkout older
than gzip support in ``predictor.dataset`` needs the logs decompressed, ``zcat``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
from scipy.stats import spearmanr

from predictor.dataset import read_logs
from predictor.prior import prior_latency, worker_load

Row = tuple[str, int, float, float]  # model, load at dispatch, predicted TTFT, measured TTFT
GROUPS: tuple[tuple[str, Callable[[Row], bool]], ...] = (
    ("idle", lambda r: r[1] == 0),
    ("busy", lambda r: r[1] > 0),
    ("any", lambda r: True),
)


def rows(paths: list[str]) -> list[Row]:
    out = []
    for s in read_logs(paths):
        if s.ttft_s:
            cached = s.features.prefix_hits.get(s.view.name, 0.0)
            ttft = prior_latency(s.profile, s.view, s.features.prompt_tokens, cached)[0]
            out.append((s.view.model, worker_load(s.view), ttft, float(s.ttft_s)))
    return out


def table(data: list[Row]) -> list[str]:
    lines = [f"{'model':14} {'load':4} {'n':>5} {'real p50':>9} {'prior p50':>9} {'real/prior':>10} "
             f"{'MAPE':>6} {'after ratio':>11} {'spearman':>8}"]  # fmt: skip
    for model in [*sorted({r[0] for r in data}), "all"]:
        for name, keep in GROUPS:
            group = [r for r in data if (model == "all" or r[0] == model) and keep(r)]
            if len(group) < 5:
                continue
            pred, real = np.array([g[2] for g in group]), np.array([g[3] for g in group])
            ratio = float(np.median(real / pred))
            mape, after = np.mean(np.abs(pred - real) / real), np.mean(np.abs(pred * ratio - real) / real)
            rho = spearmanr(pred, real).statistic if len(set(pred.tolist())) > 1 else float("nan")
            head = f"{model:14} {name:4} {len(group):5d} {np.median(real) * 1e3:7.1f}ms {np.median(pred) * 1e3:7.1f}ms"
            lines.append(f"{head} {ratio:10.2f} {mape:6.3f} {after:11.3f} {rho:8.3f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+", help="request logs (JSON lines, optionally gzipped)")
    args = ap.parse_args()
    print("\n".join(table(rows(args.logs))))


if __name__ == "__main__":
    main()
