"""Dump the predictive policy's decisions on logged requests, to check that a change keeps them.

    python scripts/predictor/dump_decisions.py --train A.jsonl [--train B.jsonl] --test C.jsonl --out new.json
    python scripts/predictor/dump_decisions.py --prior --test C.jsonl --out new-prior.json   # the analytic prior
    python scripts/predictor/dump_decisions.py --compare old.json new.json

Fits a predictor on the ``--train`` logs (uncalibrated unless ``--calibration``; one OpenMP thread, so
two code versions fit the same trees), then for every ``--test`` request decides over 8 workers (the four Qwen sizes
twice) in random but seeded states — load, KV use, EWMAs, a prefix hit on every third request,
TTFT / e2e SLOs or none — under both rules (``wrong_answer_s`` 0 and 3), and writes each ranking,
reason and reported prediction, plus the full prediction on the request's own worker. Run it under
two code versions (``PYTHONPATH=<checkout>``) and ``--compare`` the files: any difference is listed.
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

from threadpoolctl import threadpool_limits

from predictor.dataset import read_logs
from predictor.model import Estimator, ModelSlot, Predictor, PriorPredictor, Sample
from predictor.prior import profile_for
from router.config import PolicyOptions
from router.policies.predictive import make_predictive
from router.types import BackendView, FleetSnapshot, RequestFeatures

MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b")


def decisions(model: Estimator, data: list[Sample]) -> list[dict[str, Any]]:
    rng = random.Random(0)
    out = []
    for wrong in (0.0, 3.0):
        for k, s in enumerate(data):
            views = tuple(
                BackendView(name=f"w{i}", model=MODELS[i % 4], running=rng.randint(0, 20),
                            waiting=rng.choice([0, 0, 0, 3]), kv_usage=rng.random() * 0.95,
                            inflight_requests=rng.randint(0, 20), inflight_tokens=rng.randint(0, 40000),
                            ttft_ewma_s=rng.choice([None, 0.2]), tpot_ewma_s=rng.choice([None, 0.02]),
                            metrics_age_s=rng.random())
                for i in range(8)
            )  # fmt: skip
            profiles = {v.name: profile_for(None, v.model, 4.0) for v in views}
            policy = make_predictive(PolicyOptions(wrong_answer_s=wrong), ModelSlot(model), profiles)
            hits = {f"w{rng.randint(0, 7)}": rng.random()} if k % 3 == 0 else {}
            f = s.features
            f = RequestFeatures(**{**{a: getattr(f, a) for a in f.__slots__}, "models": MODELS, "prefix_hits": hits,
                                   "ttft_slo_ms": rng.choice([None, 300.0, 600.0]),
                                   "e2e_slo_ms": rng.choice([None, 4000.0, 8000.0])})  # fmt: skip
            d = policy(f, FleetSnapshot(views))
            full = (model.predict(s.features, (s.view,), (s.profile,), full=True) if isinstance(model, Predictor)
                    else model.predict(s.features, (s.view,), (s.profile,)))  # fmt: skip
            out.append({"ranked": d.ranked, "reason": d.reason, "predicted": dict(d.predicted),
                        "full": [a.tolist() for a in (full.ttft, full.tpot, full.e2e, full.output, full.remaining,
                                                      full.quality)]})  # fmt: skip
    return out


def compare(a_path: str, b_path: str) -> int:
    with open(a_path, encoding="utf-8") as fa, open(b_path, encoding="utf-8") as fb:
        a, b = json.load(fa), json.load(fb)
    if len(a) != len(b):
        print(f"different lengths: {len(a)} vs {len(b)}")
        return 1
    diff = {k: sum(x[k] != y[k] for x, y in zip(a, b, strict=True)) for k in ("ranked", "reason", "predicted", "full")}
    print(f"{len(a)} decisions; differing: " + ", ".join(f"{k} {v}" for k, v in diff.items()))
    return 1 if any(diff.values()) else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", action="append", default=[])
    ap.add_argument("--test", action="append", default=[])
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    ap.add_argument("--calibration", type=float, default=0.0, help="the Predictor's calibration (default: none)")
    ap.add_argument("--prior", action="store_true", help="decide with the analytic prior (no --train)")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not ((args.train or args.prior) and args.test and args.out):
        ap.error("--train (or --prior), --test and --out (or --compare)")
    estimator: Estimator = PriorPredictor()
    if not args.prior:
        # Uncalibrated by default where the code knows calibration, so that two versions fit the same model.
        model = Predictor()
        if "calibration" in model.get_params():
            model.set_params(calibration=args.calibration)
        with threadpool_limits(limits=1, user_api="openmp"):
            estimator = model.fit(read_logs(args.train))
    res = decisions(estimator, read_logs(args.test))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(res, f)
    print(f"{len(res)} decisions -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
