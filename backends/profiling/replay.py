"""The fit's stage 3: ``frontend_s.per_request`` from the warm-up's burst, replayed through the simulator's engine.

A burst of requests sent at once finishes mostly at the pace vLLM's API server takes them in (one at a time). What
the engine itself needs for the burst depends on how its scheduler batches the prompts and decodes: rather than a
second model of vLLM's scheduler, the burst is replayed through the simulator's (:mod:`backends.sim.engine`) with
the step terms just fitted and no front end, and the rest of the measured makespan is the front end's. This module
is why ``backends.profiling`` may import the simulator (tests/test_layers.py): a tool outside serving, like the bench.
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import replace
from typing import Any

from backends.sim.engine import Engine, Request
from backends.sim.textgen import Answer
from router.core.profile import Profile, parse_profile


def engine_makespan(profile: Profile, n: int, prompt: int, out: int) -> float:
    """When the last of ``n`` requests sent at once (distinct prompts) finishes on a fresh simulated engine."""
    profile = replace(profile, ttft_jitter_s=0.0)
    eng = Engine(profile, profile.kv_budget_tokens, profile.max_num_seqs, profile.max_num_batched_tokens)
    rng = random.Random(0)
    reqs = [Request(f"r{i}", [rng.randrange(1 << 30) for _ in range(prompt)], Answer(out, 0, None), out,
                    ignore_eos=True, arrival=0.0) for i in range(n)]  # fmt: skip
    exits = [eng.frontend_exit(0.0, prompt) for _ in reqs]  # the API server takes them one at a time
    t, k = 0.0, 0
    while k < n or not eng.idle:
        while k < n and exits[k] <= t:
            eng.enqueue(reqs[k], exits[k])
            k += 1
        if eng.idle:
            t = exits[k]
            continue
        batch = eng.schedule(t)
        t += batch.duration
        eng.commit(batch, t)
    return max(float(r.finished_at or 0.0) for r in reqs)


def frontend_per_request(profile: dict[str, Any], bursts: list[dict[str, Any]]) -> float:
    """``frontend_s.per_request`` of ``profile`` (a JSON object without it yet) from measured ``bursts`` ({requests,
    prompt, out, makespan_s} each): the median over bursts of (makespan - the engine's own time for the burst,
    simulated without a front end) / requests - per_prompt_token x prompt. 0 without a burst."""
    if not bursts:
        return 0.0
    bare = json.loads(json.dumps(profile))
    bare.pop("frontend_s", None)
    engine = parse_profile(bare)
    per_token = float(profile.get("frontend_s", {}).get("per_prompt_token", 0.0))
    shares, engine_s = [], {}
    for b in bursts:
        shape = n, prompt, out = int(b["requests"]), int(b["prompt"]), int(b["out"])
        if shape not in engine_s:  # (the boots of one server burst alike)
            engine_s[shape] = engine_makespan(engine, n, prompt, out)
        shares.append((float(b["makespan_s"]) - engine_s[shape]) / n - per_token * prompt)
    return max(0.0, statistics.median(shares))
