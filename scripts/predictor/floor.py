"""The e2e MAPE floor that the workload's hidden length noise puts under any router-side predictor.

    python scripts/predictor/floor.py --log logs/heldout.jsonl [--model logs/hetero.pkl]

Each answer's length is ``median_role · (1 + gain_role · D) · detail · exp(sigma_role · z)``
(``router.bench.workloads``); the role, the detail word and the topic (hence D up to N(0, 0.06)) are
visible to a router, ``z`` is not. The best a p50 predictor can do is the median given the visible
part, i.e. ``o · exp(-eta)`` for an answer of ``o`` tokens whose hidden log-noise was ``eta ~
N(0, sigma² + (gain · 0.06 / (1 + gain · D))²)``. With the request's own TTFT and TPOT (so the
latency model is perfect), that predictor's e2e APE is ``o · |exp(-eta) - 1| · TPOT / e2e``; its
expectation over ``eta`` per logged request, averaged, is the floor. Reported beside the same for
output tokens, and (``--model``) the predictor's own e2e / length MAPE and e2e MAPE given the true
length on the same requests.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from predictor.dataset import read_log, samples
from router.bench.workloads import ROLES

D_NOISE = 0.06  # sd of a task's difficulty around its topic's base (router.bench.workloads)
D_TYPICAL = 0.5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", action="append", required=True)
    ap.add_argument("--model")
    ap.add_argument("--draws", type=int, default=4000)
    args = ap.parse_args()
    records: list[dict[str, object]] = []
    feedback: dict[str, float] = {}
    for path in args.log:
        r, f = read_log(path)
        records += r
        feedback.update(f)
    data = [s for s in samples(records, feedback) if s.features.agent in ROLES and s.output_tokens and s.tpot_s]
    eta = np.random.default_rng(0).standard_normal(args.draws)
    e2e_ape, len_ape, len_ape_best = [], [], []
    for s in data:
        role = ROLES[s.features.agent]
        sd = math.hypot(role.sigma, role.gain * D_NOISE / (1.0 + role.gain * D_TYPICAL))
        ratio = np.abs(np.exp(-sd * eta) - 1.0)  # |median prediction / actual - 1| over the hidden noise
        o, tpot, e2e = float(s.output_tokens or 0), float(s.tpot_s or 0.0), float(s.e2e_s or 0.0)
        e2e_ape.append(float(np.mean(o * ratio * tpot / e2e)))
        len_ape.append(float(np.mean(ratio)))
        len_ape_best.append(float(np.mean(np.abs(np.exp(-sd * eta - sd * sd) - 1.0))))  # MAPE-optimal scale
    out: dict[str, object] = {
        "requests": len(data),
        "floor_e2e_p50_mape": round(float(np.mean(e2e_ape)), 4),
        "floor_output_p50_mape": round(float(np.mean(len_ape)), 4),
        "floor_output_mape_optimal_scale": round(float(np.mean(len_ape_best)), 4),
    }
    if args.model:
        from predictor import artifact
        from predictor.evaluate import evaluate

        report = evaluate(artifact.load(args.model)[0], data)
        out["model_e2e_p50_mape"] = report["e2e_ms"]["p50_mape"]
        out["model_output_p50_mape"] = report["output_tokens"]["p50_mape"]
        out["model_output_kendall_tau"] = report["output_tokens"].get("kendall_tau")
        out["model_e2e_given_length_mape"] = report["e2e_given_length_ms"]["p50_mape"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
