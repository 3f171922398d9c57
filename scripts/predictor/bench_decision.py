"""Micro-benchmark of one predictive routing decision over 8 candidate workers.

    python scripts/predictor/bench_decision.py --model logs/pred.pkl   # a trained predictor
    python scripts/predictor/bench_decision.py                          # the analytic prior only

Times ``policy(features, snapshot)`` (the whole decision: features of 8 workers, both packed
forests, quality, the slack rule, the Decision) and, for reference, the per-request text features
the gateway computes once (sketch, task terms and prefix hashes of a coder step of the bench's codegen workload).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from chimera_bench.workloads import make_workflow
from predictor import artifact
from predictor.model import ModelSlot, PriorPredictor
from predictor.prior import profile_for
from predictor.sketch import prefix_hashes, prompt_text, task_text, text_features
from router.core.config import PolicyOptions
from router.core.types import BackendView, FleetSnapshot, RequestFeatures
from router.policies.predictive import make_predictive

MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b")


def timeit(fn: Callable[[], object], n: int) -> tuple[float, float]:
    for _ in range(200):
        fn()
    ts = np.empty(n)
    for i in range(n):
        t = time.perf_counter()
        fn()
        ts[i] = time.perf_counter() - t
    return float(np.median(ts) * 1e6), float(np.quantile(ts, 0.99) * 1e6)


def setup(model: str | None, feedback: bool = True) -> tuple[Callable[[], object], Callable[[], object], int]:
    """(one decision over 8 workers, the per-request text features, the prompt's words) of a coder step.
    The workers carry observed / predicted ratios, as on a gateway that has served traffic."""
    est = artifact.load(model)[0] if model else PriorPredictor()
    views = tuple(
        BackendView(name=f"w{i}", model=MODELS[i % 4], running=3 * i, waiting=i // 4, kv_usage=0.04 * i,
                    inflight_requests=3 * i, inflight_tokens=2500 * i, ttft_ewma_s=0.1, tpot_ewma_s=0.02,
                    metrics_age_s=0.4, ttft_bias=1.1 + 0.05 * i, tpot_bias=0.9 + 0.04 * i)
        for i in range(8)
    )  # fmt: skip
    profiles = {v.name: profile_for(None, v.model, 4.0) for v in views}
    policy = make_predictive(PolicyOptions(latency_feedback=feedback), ModelSlot(est), profiles)
    wf = make_workflow("codegen", 1, 0)  # a coder step of the bench's workload: task, plan, instruction
    plan = wf.next_step()
    assert plan is not None
    wf.record(plan, "plan " * 120 + "[correct]")
    step = wf.next_step()
    assert step is not None
    body = {"messages": step.messages}
    text = prompt_text("chat", body)
    sk, terms = text_features(text, task_text("chat", body))
    f = RequestFeatures(agent="coder", endpoint="chat", models=MODELS, prompt_tokens=len(text.split()),
                        max_tokens=2048, stream=True, message_count=len(step.messages), ttft_slo_ms=6000,
                        e2e_slo_ms=160000, sketch=sk, terms=terms, prefix_hits={"w2": 0.5})  # fmt: skip
    snap = FleetSnapshot(views)
    return (
        (lambda: policy(f, snap)),
        (lambda: (text_features(prompt_text("chat", body), task_text("chat", body)), prefix_hashes(text))),
        len(text.split()),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a predictor file (default: the prior)")
    ap.add_argument("-n", type=int, default=5000)
    args = ap.parse_args()
    decide, text_work, words = setup(args.model)
    without, _, _ = setup(args.model, feedback=False)
    kind = "Predictor" if args.model else "PriorPredictor"
    p50, p99 = timeit(decide, args.n)
    print(f"decision over 8 workers ({kind}): p50 {p50:.0f} us  p99 {p99:.0f} us")
    p50, p99 = timeit(without, args.n)
    print(f"  the same without latency feedback: p50 {p50:.0f} us  p99 {p99:.0f} us")
    p50, p99 = timeit(text_work, args.n // 5)
    print(f"per-request text features ({words} words): p50 {p50:.0f} us  p99 {p99:.0f} us")


if __name__ == "__main__":
    main()
