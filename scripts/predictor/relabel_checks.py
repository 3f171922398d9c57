"""Relabel the bench's checker verdicts in a request log: a check is good when it agrees with the answer it checked.

    python scripts/predictor/relabel_checks.py logs/collect-rr/logs/requests-round_robin-rate2-s11.jsonl \
        logs/collect-strict/requests-round_robin-rate2-s11.jsonl

``chimera bench`` posts ``correct = the answer ends with [correct]`` for every step. For a tester or
verifier that is "it passed", which is a false pass when the answer it checked was ``[wrong]``; the
simulator draws such passes more often from bigger models, so a quality model trained on those
labels learns to send checks of wrong answers to big models (docs/PREDICTOR.md, *Strict success*).
Here a checker step's score becomes 1 when its verdict equals the checked answer's (the previous
step of the same workflow), else 0; every other line is copied unchanged.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from itertools import pairwise
from typing import Any

CHECKERS = ("tester", "verifier")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    args = ap.parse_args()
    with open(args.src, encoding="utf-8") as f:
        lines: list[dict[str, Any]] = [json.loads(line) for line in f]
    scores = {d["request_id"]: d["score"] for d in lines if d.get("type") == "feedback"}
    flows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in lines:
        if d.get("endpoint") and d.get("workflow_id"):
            flows[d["workflow_id"]].append(d)
    relabelled = dict(scores)
    for steps in flows.values():
        steps.sort(key=lambda d: d["ts"])
        for prev, step in pairwise(steps):
            rid, checked = step["request_id"], prev["request_id"]
            if step.get("agent") in CHECKERS and rid in scores and checked in scores:
                relabelled[rid] = 1.0 if scores[rid] == scores[checked] else 0.0
    changed = sum(relabelled[k] != scores[k] for k in scores)
    with open(args.dst, "w", encoding="utf-8") as f:
        for d in lines:
            if d.get("type") == "feedback" and d.get("request_id") in relabelled:
                d = {**d, "score": relabelled[d["request_id"]]}
            f.write(json.dumps(d) + "\n")
    print(f"{args.src}: {changed} of {len(scores)} verdicts changed")


if __name__ == "__main__":
    main()
