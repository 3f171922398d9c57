#!/usr/bin/env python3
"""Offline replay of the calibration probes against the simulator's engine, on a virtual clock.

``compare.py`` runs ``probe.py`` against a live sim over HTTP: faithful, but ~40 min on 2 cores and noisy
(the load probes must run slowed down). This drives the very same ``backends.sim.engine.Engine`` (scheduler,
KV cache, step-time model, serial front end) with the probes' workloads in simulated time instead, in a few
seconds, so that a profile or a model change can be judged at once. It writes result files in probe.py's
format (only the fields compare.py tabulates), so that

    python scripts/calibrate/replay.py --out-dir /tmp/chimera-replay
    python scripts/calibrate/compare.py --table-only --out-dir /tmp/chimera-replay --write ''

prints the same sim-vs-real table. Client-side costs the engine does not model (the sim's own HTTP/SSE time,
``--sim-http-ms``, which fit_profile.py took off ``overhead_s.ttft``) are added back to every TTFT and e2e.
Workloads (as run 1 of the real probes): every request of a batch sent at t=0; TTFT at batch 1;
TPOT p50 at batch 1..128 x prompt 256/2048, 128 out; saturation 256 x (128 + 256) non-streaming; the mix
probe (32 decoders + injected prompts at the real injection times); KV pressure (64 x (1024 + 1024) on 32,768
KV tokens).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from backends.sim.engine import Engine, Request  # noqa: E402
from backends.sim.profile import Profile, load_profile  # noqa: E402
from backends.sim.textgen import Answer  # noqa: E402

DATA = HERE / "data"
MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b")
TTFT_PROMPTS = (128, 512, 2048, 8192)
TPOT_PROMPTS, TPOT_BATCHES, TPOT_OUT = (256, 2048), (1, 8, 32, 64, 128), 128


class Run:
    """One batch of requests through a fresh engine; arrivals are (time_s, prompt, out)."""

    def __init__(
        self, profile: Profile, arrivals: list[tuple[float, int, int]], kv_tokens: int | None = None, seed: int = 0
    ) -> None:
        profile = replace(profile, ttft_jitter_s=0.0)  # the cells are medians; the spread's median is its centre
        self.engine = Engine(
            profile, kv_tokens or profile.kv_budget_tokens, profile.max_num_seqs, profile.max_num_batched_tokens
        )
        rng = random.Random(seed)
        self.reqs: list[Request] = []  # in arrival order
        for i, (t, p, o) in enumerate(sorted(arrivals)):
            ids = [rng.randrange(1 << 30) for _ in range(p)]  # distinct prompts: no prefix-cache hits
            self.reqs.append(Request(f"r{i}", ids, Answer(o, 0, None), o, ignore_eos=True, arrival=t))
        self.max_running = self.max_waiting = 0
        self.first_seen: list[float] = []
        self.done_seen: list[float] = []

    def go(self) -> Run:
        """Run to completion. Sets ``first_seen`` / ``done_seen`` per request: when its first and last token
        come out of the engine (in the live sim the HTTP layer adds its own cost: ``--sim-http-ms``)."""
        eng, reqs = self.engine, self.reqs
        first: dict[int, float] = {}
        done: dict[int, float] = {}
        pending: list[tuple[float, int]] = []  # (time it leaves the front end, index)
        a, t = 0, 0.0
        while a < len(reqs) or pending or not eng.idle:
            while a < len(reqs) and reqs[a].arrival <= t:  # the front end takes arrivals in order
                heapq.heappush(pending, (eng.frontend_exit(reqs[a].arrival, reqs[a].prompt_len), a))
                a += 1
            while pending and pending[0][0] <= t:
                at, i = heapq.heappop(pending)
                eng.enqueue(reqs[i], at)
            if eng.idle:
                t = min(pending[0][0] if pending else float("inf"), reqs[a].arrival if a < len(reqs) else float("inf"))
                continue
            batch = eng.schedule(t)
            self.max_running = max(self.max_running, len(eng.running))
            self.max_waiting = max(self.max_waiting, len(eng.waiting))
            end = t + batch.duration
            while a < len(reqs) and reqs[a].arrival <= end:  # arrivals during the step reach the front end
                heapq.heappush(pending, (eng.frontend_exit(reqs[a].arrival, reqs[a].prompt_len), a))
                a += 1
            eng.commit(batch, end)
            seen = end
            for r in batch.requests:
                k = int(r.request_id[1:])
                if r.first_token == end and k not in first:
                    first[k] = seen
                if r.finished_at == end:
                    done[k] = seen
            t = end
        self.first_seen = [first[k] for k in range(len(reqs))]
        self.done_seen = [done[k] for k in range(len(reqs))]
        return self


def replay_model(prof: Profile, real: dict, http_s: float) -> tuple[dict, dict]:
    ttft = []
    for n in TTFT_PROMPTS:
        run = Run(prof, [(0.0, n, 1)]).go()
        ttft.append({"prompt": n, "ttft_ms": (run.first_seen[0] + http_s) * 1e3})
    tpot = []
    for p in TPOT_PROMPTS:
        for b in TPOT_BATCHES:
            run = Run(prof, [(0.0, p, TPOT_OUT)] * b).go()
            tp = [(d - f) / (TPOT_OUT - 1) for f, d in zip(run.first_seen, run.done_seen, strict=True)]
            tpot.append(
                {
                    "prompt": p,
                    "batch": b,
                    "tpot_ms_p50": statistics.median(tp) * 1e3,
                    "ttft_ms_p50": (statistics.median(run.first_seen) + http_s) * 1e3,
                    "ttft_ms_max": (max(run.first_seen) + http_s) * 1e3,
                }
            )
    sat = (real.get("saturation") or {}).get("nonstream") or {"streams": 256, "prompt": 128, "out": 256}
    run = Run(prof, [(0.0, sat["prompt"], sat["out"])] * sat["streams"]).go()
    mk = max(run.done_seen) + http_s
    saturation = {
        "nonstream": {"streams": sat["streams"], "makespan_s": mk, "out_tok_s": sat["streams"] * sat["out"] / mk}
    }
    mix = real.get("mix") or {}
    inj = []
    if mix:
        arr = [(0.0, 256, mix["decode_out"])] * mix["batch"]
        arr += [(i["at_s"], i["prompt"], 1) for i in mix["inject"]]
        run = Run(prof, arr).go()
        for i in mix["inject"]:
            k = next(k for k, x in enumerate(run.reqs) if x.arrival == i["at_s"])
            inj.append(
                {"prompt": i["prompt"], "at_s": i["at_s"], "ttft_ms": (run.first_seen[k] - i["at_s"] + http_s) * 1e3}
            )
    return {"ttft": ttft}, {"tpot": tpot, "saturation": saturation, "mix": {"batch": mix.get("batch"), "inject": inj}}


def replay_kv(prof: Profile, real: dict, http_s: float) -> dict:
    run = Run(prof, [(0.0, real["prompt"], real["out"])] * real["requests"], kv_tokens=real["kv_tokens"]).go()
    e2e = sorted(d + http_s for d in run.done_seen)
    q = lambda x: e2e[min(len(e2e) - 1, round(x * (len(e2e) - 1)))]  # noqa: E731
    return {
        "kv": {
            "kv_tokens": real["kv_tokens"],
            "makespan_s": e2e[-1],
            "e2e_s_p50": statistics.median(e2e),
            "e2e_s_p99": q(0.99),
            "preemptions": run.engine.stats.preemptions,
            "max_running": run.max_running,
            "max_waiting": run.max_waiting,
        }
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--profiles", default=str(ROOT / "backends" / "sim" / "profiles"))
    ap.add_argument("--out-dir", default="/tmp/chimera-replay")
    ap.add_argument("--sim-http-ms", type=float, default=3.0)
    a = ap.parse_args()
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    http_s = a.sim_http_ms / 1e3
    for m in [m for m in a.models.split(",") if m]:
        prof = load_profile(str(Path(a.profiles) / f"h200-{m}.json"))
        real = json.loads((DATA / f"probe-{m}.json").read_text())
        d1, d2 = replay_model(prof, real, http_s)
        (out / f"sim-{m}-ttft.json").write_text(json.dumps(d1))
        (out / f"sim-{m}-load.json").write_text(json.dumps(d2))
    kv = json.loads((DATA / "probe-kvsmall.json").read_text()).get("kv")
    if kv:
        prof = load_profile(str(Path(a.profiles) / "h200-qwen2.5-0.5b.json"))
        (out / "sim-kvsmall.json").write_text(json.dumps(replay_kv(prof, kv, http_s)))
    print(f"wrote {out}/sim-*.json")


if __name__ == "__main__":
    main()
