"""A synthetic request log in the gateway's format, with a known latency law (for fast tests)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from predictor.sketch import sketch

MODELS = {"qwen2.5-0.5b": ("h200-qwen2.5-0.5b", 0.6), "qwen2.5-7b": ("h200-qwen2.5-7b", 1.0)}
AGENTS = {"planner": 80, "coder": 300}  # median output tokens


def records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        agent = rng.choice(list(AGENTS))
        model = rng.choice(list(MODELS))
        profile, slow = MODELS[model]
        detail = rng.choice(["briefly", "thoroughly"])
        words = rng.randint(50, 1500)
        load = rng.randint(0, 30)
        tokens = max(2, int(AGENTS[agent] * (0.5 if detail == "briefly" else 1.5) * rng.lognormvariate(0, 0.2)))
        ttft = (0.02 + 0.00004 * words + 0.01 * load) * slow * rng.lognormvariate(0, 0.15)
        tpot = (0.004 + 0.0002 * load) * slow * rng.lognormvariate(0, 0.1)
        rid = f"r{seed}-{i}"
        out.append({
            "request_id": rid, "endpoint": "chat", "ts": 1000.0 + i, "agent": agent, "model": model,
            "backend": model + "-0", "stream": True, "prompt_tokens_est": words, "max_tokens": 2048,
            "message_count": 2, "completion_tokens": tokens, "ttft_s": ttft, "tpot_s": tpot,
            "e2e_s": ttft + (tokens - 1) * tpot, "outcome": "ok", "status": 200,
            "workflow_id": f"wf{i // 3}", "workflow_stage": i % 3,
            "sketch": list(sketch(f"system {agent} answer {detail} task {'x ' * 5}")),
            "fleet": {"inflight_requests": load, "inflight_tokens": load * 600, "running": load, "waiting": 0,
                      "kv_usage": load / 100, "metrics_age_s": 0.5, "kv_budget_tokens": 100000,
                      "ttft_ewma_s": None, "tpot_ewma_s": None, "profile": profile, "time_scale": 1.0,
                      "prefix_share": 0.0},
        })  # fmt: skip
    return out


def write_log(path: Path, n: int, seed: int = 0, feedback: bool = True) -> Path:
    rng = random.Random(seed + 1)
    with path.open("w") as f:
        for r in records(n, seed):
            f.write(json.dumps(r) + "\n")
            if feedback:
                good = rng.random() < (0.8 if r["model"] == "qwen2.5-7b" else 0.3)
                f.write(json.dumps({"type": "feedback", "request_id": r["request_id"], "score": float(good)}) + "\n")
    return path
