"""The H200 chat runs' prefix-cache counters against an all-<unk> replay of the bench's prompts and the sims.

    python scripts/calibrate/unk_prefix.py docs/results/real-h200/sim-wl-chat-s1.json \
        docs/results/real-h200/sim-wl-chat-s2.json

The test models' word-level tokenizer (../shared/gpu/mkmodels.py) makes every bench word <unk>, so a prompt
of L tokens hits min((L - 1) // 16, the longest earlier prompt in blocks) * 16 cached tokens. Prints a
markdown table: real (per run, the difference of the cumulative counters from the run before), that model
where the routing is known, the Rerun-2 sim (its own tokenizer) and the given sims (docs/REAL_VLLM.md,
"Rerun 3").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from router.bench.client import poisson_arrivals  # noqa: E402
from router.bench.workloads import make_workflow  # noqa: E402

RESULTS = ROOT / "docs" / "results" / "real-h200"
BLOCK = 16
ORDER = ("round_robin", "least_outstanding", "predictive")  # the H200 run's order; counters count from boot
WORKERS = ("q05-0", "q15-0", "q7-0")


def real_len(messages: list[dict[str, str]]) -> int:
    """Tokens under mkmodels' chat template: "{role} {content} " per message, then "assistant"."""
    return sum(1 + len(m["content"].split()) for m in messages) + 1


def unk_model(lens: list[int]) -> tuple[int, int]:
    cached = queries = hits = 0
    for n in lens:
        queries += n
        hits += min((n - 1) // BLOCK, cached) * BLOCK
        cached = max(cached, n // BLOCK)
    return queries, hits


def counters(path: Path) -> dict[str, Any]:
    return {e["policy"]: e["worker_counters"] for e in json.loads(path.read_text())}


def diff(now: dict[str, Any], before: dict[str, Any] | None, w: str) -> tuple[float, float]:
    q, h = now[w]["prefix_cache_queries"], now[w]["prefix_cache_hits"]
    if before is not None:
        q, h = q - before[w]["prefix_cache_queries"], h - before[w]["prefix_cache_hits"]
    return q, h


def cell(q: float, h: float) -> str:
    return f"{q:.0f} / {h:.0f} ({100 * h / q:.0f} %)"


def rows(seed: int, duration: float, sim_path: Path) -> list[str]:
    real = counters(RESULTS / ("real-chat.json" if seed == 1 else f"real-chat-s{seed}.json"))
    old, new = counters(RESULTS / f"sim-ts-chat-s{seed}.json"), counters(sim_path)
    n = len(poisson_arrivals(6.0, 4 + duration, seed))
    step = [make_workflow("chat", seed, i).next_step() for i in range(n)]
    lens = [real_len(s.messages) for s in step if s is not None]
    out = []
    for k, pol in enumerate(ORDER):
        if k == 0 and seed != 1:
            continue  # seed 2's boot ran the co-location probe first: no clean start
        before = real[ORDER[k - 1]] if k else None
        for i, w in enumerate(WORKERS):
            rq, rh = diff(real[pol], before, w)
            if rq == 0:
                continue
            model = "–"  # noqa: RUF001
            if pol == "round_robin":
                model = "{} / {}".format(*unk_model(lens[i::3]))
            elif pol == "predictive" and w == "q15-0":
                model = "{} / {}".format(*unk_model(lens))
            out.append(
                f"| {seed} | {pol} | {w} | {cell(rq, rh)} | {model} | {cell(*diff(old[pol], None, w))} "
                f"| {cell(*diff(new[pol], None, w))} |"
            )
    return out


def main() -> None:
    sims = [Path(p) for p in sys.argv[1:3]]
    head = ("seed", "policy", "worker", "real queries / hits", "all-`<unk>` model", "sim, Rerun 2", "sim, word-level")
    print("| " + " | ".join(head) + " |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for seed, duration, sim in zip((1, 2), (15.0, 16.0), sims, strict=False):
        print("\n".join(rows(seed, duration, sim)))


if __name__ == "__main__":
    main()
