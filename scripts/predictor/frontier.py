"""How fast can any per-step router make the bench's ``mixed`` workflows at a given task success?

An uncontended Monte Carlo of the workload (``router.bench.workloads``) on the heterogeneous fleet's
profiles: every step's time is the analytic prior's (``predictor.prior.prior_latency``) at a fixed
load per worker (``--load``), with the step's *true* output length; every answer's verdict is drawn
with the simulator's law, ``P(correct) = sigmoid(8 (quality - difficulty))``, and the workflow goes on
as the bench's would (retry rounds, checks). Rules:

* ``rr`` — a uniform choice among the agent's eligible models (round robin over one worker per model);
* ``cost W`` — the predictive policy's expected-cost rule with an *oracle*: each step's true
  difficulty and length, ``time + (1 - P(good answer)) x W`` (a checker's answer is good when its
  verdict is right), minimised per step — the best the rule could do with perfect predictions;
  ``cost W+S`` — the same with ``W + S x stage`` (``wrong_answer_stage_s``; the stage is the step's
  index in its workflow, as ``x-workflow-stage`` says).

It ignores queueing (each worker's load is fixed), which favours the rules that pile work onto one
worker; a real run's contention moves every rule's times, not the shape of the trade.

    python scripts/predictor/frontier.py                       # seed 12, 3,000 workflows, W = 2 ... 12
    python scripts/predictor/frontier.py --w 3,6,3+3 --load 2,8,3,2
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import Counter

from backends.sim.textgen import p_correct
from predictor.prior import WorkerProfile, prior_latency, profile_for
from router.bench.workloads import CORRECT, make_workflow
from router.config import load_config
from router.policies.predictive import MAX_STAGE
from router.types import BackendView

MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b")
FLEET = "examples/bench-hetero.yaml"  # whose agents say which models may serve each role


def step_time(profile: WorkerProfile, model: str, load: int, prompt: int, out: int) -> float:
    view = BackendView(name=model, model=model, running=load, waiting=0, kv_usage=0.2,
                       inflight_requests=load, inflight_tokens=2000 * load)  # fmt: skip
    ttft, tpot = prior_latency(profile, view, prompt, 0.5)
    return ttft + (out - 1) * tpot


def run(
    rule: str, w: float, loads: dict[str, int], seed: int, n: int, per_stage: float = 0.0
) -> tuple[float, float, float, Counter[str]]:
    """(median workflow time in modelled s, task success, strict success, steps per model)."""
    profiles = {m: profile_for(None, m, 1.0) for m in MODELS}
    eligible = {a.name: a.models for a in load_config(FLEET).agents}
    rng, times, ok, strict, share = random.Random(seed), [], 0, 0, Counter[str]()
    for i in range(n):
        wf, t = make_workflow("mixed", seed, i), 0.0
        while (step := wf.next_step()) is not None:
            cost_wrong = w + per_stage * min(wf.steps, MAX_STAGE)  # wf.steps: the stage the bench sends
            prompt = sum(len(m["content"].split()) for m in step.messages)
            cost = {m: step_time(profiles[m], m, loads[m], prompt, step.output_tokens) for m in eligible[step.agent]}

            p_right = {m: p_correct(profiles[m].quality, step.difficulty) for m in cost}
            checks_wrong = step.agent in ("tester", "verifier") and not wf.last_ok  # a good check rejects it
            good = {m: 1.0 - p if checks_wrong else p for m, p in p_right.items()}
            expected = {m: cost[m] + (1 - good[m]) * cost_wrong for m in cost}
            m = rng.choice(list(cost)) if rule == "rr" else min(expected, key=expected.__getitem__)
            share[m] += 1
            t += cost[m]
            right = rng.random() < p_right[m]
            wf.record(step, "answer " + (CORRECT if right else "[wrong]"))
        times.append(t)
        ok += wf.succeeded
        strict += wf.succeeded_strict
    return statistics.median(times), ok / n, strict / n, share


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("-n", type=int, default=3000)
    ap.add_argument(
        "--w",
        default="2,3,4,6,8,12,2+2,3+1.5,3+3",
        help="wrong-answer costs to try, modelled seconds: W, or W+S for W + S per workflow stage",
    )
    ap.add_argument("--load", default="2,8,3,2", help="requests running on the 0.5B, 1.5B, 7B, 14B")
    args = ap.parse_args()
    loads = dict(zip(MODELS, (int(x) for x in args.load.split(",")), strict=True))
    base, *_ = rr = run("rr", 0.0, loads, args.seed, args.n)
    rules = [(w, *(float(x) for x in f"{w}+0".split("+")[:2])) for w in args.w.split(",")]
    rows = [("rr", rr), *((f"cost {w}", run("cost", a, loads, args.seed, args.n, b)) for w, a, b in rules)]
    print(f"seed {args.seed}, {args.n} workflows, load {args.load}")
    print("rule        wf p50 s  rr / this  success  strict  share 0.5B/1.5B/7B/14B %")
    for name, (p50, ok, strict, share) in rows:
        total = sum(share.values())
        shares = "/".join(f"{100 * share[m] / total:.0f}" for m in MODELS)
        print(f"{name:11} {p50:8.2f}  {base / p50:8.2f}x  {100 * ok:6.1f}  {100 * strict:6.1f}  {shares}")


if __name__ == "__main__":
    main()
