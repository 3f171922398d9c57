"""A/B of one predictive decision over 8 workers: two code versions, finely interleaved.

    python scripts/predictor/ab_decision.py --a /tmp/base:logs/old.pkl --b .:logs/new.pkl [--reps 3]

``--a`` / ``--b`` are ``CHECKOUT:MODEL`` (``CHECKOUT`` goes first on the worker's ``PYTHONPATH``; a
model of the format that checkout reads). One worker process per side runs
:func:`bench_decision.setup`'s decision (a coder step of the bench's codegen workload over 8
workers); the driver has them take turns — ``--batch`` timed decisions on A, then on B, ``--turns``
times — so that both see the same machine: on a shared VM whose speed drifts within seconds,
separate runs are not comparable. Prints each repetition's p50 and p99 per side, and the lowest of its
turns' p50s ("best turn": the machine's quietest moment, steadier than the p50 when other jobs come
and go).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def worker(model: str) -> None:
    sys.path.insert(0, str(HERE))
    from bench_decision import setup

    decide, _, _ = setup(model or None)
    for _ in range(300):
        decide()
    for line in sys.stdin:
        n = int(line)
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            decide()
            ts.append(time.perf_counter() - t)
        print(json.dumps(ts), flush=True)


def spawn(side: str) -> subprocess.Popen[str]:
    checkout, _, model = side.partition(":")
    env = {**os.environ, "PYTHONPATH": str(Path(checkout).resolve())}
    model = str(Path(model).resolve()) if model else ""
    return subprocess.Popen([sys.executable, __file__, "--worker", model], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd="/")  # fmt: skip


def ask(p: subprocess.Popen[str], n: int) -> list[float]:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(f"{n}\n")
    p.stdin.flush()
    out: list[float] = json.loads(p.stdout.readline())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", help="CHECKOUT:MODEL of side A (the before)")
    ap.add_argument("--b", help="CHECKOUT:MODEL of side B (the after)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--batch", type=int, default=250)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return
    if not (args.a and args.b):
        ap.error("--a and --b")
    sides = {"A": spawn(args.a), "B": spawn(args.b)}
    try:
        for rep in range(1, args.reps + 1):
            times: dict[str, list[float]] = {"A": [], "B": []}
            best: dict[str, float] = {"A": np.inf, "B": np.inf}
            for turn in range(args.turns):
                for name in "AB" if turn % 2 == 0 else "BA":
                    batch = ask(sides[name], args.batch)
                    times[name] += batch
                    best[name] = min(best[name], float(np.median(batch)))
            line = [f"rep {rep}:"]
            for name in "AB":
                t = np.asarray(times[name]) * 1e6
                line.append(f"{name} p50 {np.median(t):.0f} us p99 {np.quantile(t, 0.99):.0f} us "
                            f"best turn {best[name] * 1e6:.0f} us (n {len(t)})")  # fmt: skip
            ratio = np.median(times["B"]) / np.median(times["A"])
            print("  ".join(line) + f"  B/A p50 {ratio:.2f} best turn {best['B'] / best['A']:.2f}", flush=True)
    finally:
        for p in sides.values():
            assert p.stdin is not None
            p.stdin.close()
            p.wait(timeout=30)


if __name__ == "__main__":
    main()
