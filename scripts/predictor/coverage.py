"""p90 coverage of a predictor on request logs: overall, per log (one bench run each) and per load bucket.

    python scripts/predictor/coverage.py --model logs/hetero.pkl --log A.jsonl --log B.jsonl [--edges 3,10]

The calibration's target is 0.85-0.95 for every target *and* in every run and load regime, not only
on average; this splits ``predictor.evaluate`` by log file and by the serving worker's load at dispatch
(running + waiting, or the gateway's in-flight requests when more — ``predictor.prior.worker_load``;
default buckets: the terciles of the logs' own loads). Uses only what every predictor version has, so
two code versions can score the same logs (``PYTHONPATH=<checkout>``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from predictor import artifact
from predictor.dataset import read_logs
from predictor.evaluate import evaluate
from predictor.model import Estimator, PriorPredictor, Sample
from predictor.prior import worker_load

TARGETS = ("ttft_ms", "tpot_ms", "e2e_ms", "output_tokens")


def line(name: str, estimator: Estimator, data: Sequence[Sample]) -> str:
    if not data:
        return f"{name:28} n 0"
    r = evaluate(estimator, data)
    cover = "  ".join(f"{t.split('_')[0]} {r[t].get('p90_coverage', float('nan')):.3f}" for t in TARGETS)
    return f"{name:28} n {len(data):5}  {cover}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a predictor file, or 'prior'")
    ap.add_argument("--log", action="append", required=True)
    ap.add_argument("--edges", help="load bucket edges, e.g. 3,10 (bucket i: edges[i-1] < load <= edges[i])")
    args = ap.parse_args()
    estimator: Estimator = PriorPredictor() if args.model == "prior" else artifact.load(args.model)[0]
    data = read_logs(args.log)
    print(line("all", estimator, data))
    for path in args.log:
        print(line(path.rsplit("/", 1)[-1].removesuffix(".jsonl"), estimator, read_logs([path])))
    loads = np.asarray([worker_load(s.view) for s in data], dtype=np.float64)
    edges = ([float(e) for e in args.edges.split(",")] if args.edges
             else sorted(set(np.quantile(loads, [1 / 3, 2 / 3]).tolist())))  # fmt: skip
    bucket = np.searchsorted(np.asarray(edges), loads, side="left")
    bounds = [-np.inf, *edges, np.inf]
    for b in range(len(edges) + 1):
        rows = [s for s, k in zip(data, bucket, strict=True) if k == b]
        print(line(f"load ({bounds[b]:g}, {bounds[b + 1]:g}]", estimator, rows))


if __name__ == "__main__":
    main()
