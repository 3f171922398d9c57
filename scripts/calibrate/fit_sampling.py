#!/usr/bin/env python3
"""Fit the profiles' ``sampling_s`` (the sampler's extra CPU work per step for non-greedy requests).

Data: the co-location probes' "alone" phases run with more than one kind of sampling on one boot
(``colocate.py probe --alone --sampling greedy,bench``: ``data/colocate-h200-s3.json``, Rerun 6 of
docs/REAL_VLLM.md). Each (worker, batch) measured greedy and with another kind back to back gives the step's
extra time for that kind: ``bench`` is what the bench's requests reach real vLLM with (no temperature, so 1.0,
and ``min_tokens = max_tokens`` from backends/simfields.py); ``temp`` (temperature 1 only), ``mintok``
(temperature 0 + ``min_tokens``) and ``topp`` come from the finer probe (``colocate.py --sampling``), when run.

The model (backends/sim/profile.py ``Sampling``, docs/CALIBRATION.md "Sampling cost"): the extra work is CPU
(vLLM's sampler launches a handful more kernels and runs the min-tokens processor's Python per step, on a
[batch, 151,936] logits tensor: the same work for every Qwen2.5 size), overlapped with the GPU, so a step lasts
``max(step, cpu + cost)``. A CPU-bound worker (``gpu_share`` < ``--gpu-bound-share``: the 0.5B, 1.5B) pays all
of it, and its measured extra time is the cost: ``random`` is the mean over the CPU-bound workers' phases
(one number: the work does not depend on the model). A GPU-bound worker (the 7B, 14B) gets ``cpu_base`` and
``cpu_per_seq``: its engine's CPU time per step, taken as the CPU-bound ``--cpu-reference`` profile's decode step
(the same engine code, its step all CPU), which its longer GPU step hides; its measured extra time checks that.

    python scripts/calibrate/fit_sampling.py              # writes sampling_s into backends/sim/profiles/h200-*.json
    python scripts/calibrate/fit_sampling.py --dry-run
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
PROFILES = HERE.parents[1] / "backends" / "sim" / "profiles"
# which probe kinds carry which request features (colocate.py SAMPLING); "bench" has both
KINDS = {"bench": ("random", "min_tokens"), "temp": ("random",), "mintok": ("min_tokens",)}


def pairs(colocate: dict[str, Any]) -> list[dict[str, Any]]:
    """(worker, batch, kind, greedy ms, kind ms) of every alone phase measured greedy and with another kind."""
    greedy: dict[tuple[str, int], list[float]] = {}
    other: dict[tuple[str, int, str], list[float]] = {}
    for p in colocate["phases"]:
        if len(p["subset"]) != 1:
            continue
        m, b, kind = p["subset"][0], p["batch"], p.get("sampling", "greedy")
        if kind == "greedy":
            greedy.setdefault((m, b), []).append(p["tpot_ms"][m])
        else:
            other.setdefault((m, b, kind), []).append(p["tpot_ms"][m])
    return [{"model": m, "batch": b, "kind": k, "greedy_ms": statistics.mean(greedy[(m, b)]),
             "ms": statistics.mean(v), "delta_ms": statistics.mean(v) - statistics.mean(greedy[(m, b)])}
            for (m, b, k), v in sorted(other.items()) if (m, b) in greedy]  # fmt: skip


def fit(rows: list[dict[str, Any]], profiles: dict[str, dict[str, Any]], gpu_bound_share: float,
        reference: str) -> dict[str, Any]:  # fmt: skip
    """The fitted section per profile and the evidence, as a dict (printed, and written by ``main``)."""
    bound = {m for m, p in profiles.items() if p.get("gpu_share", 1.0) >= gpu_bound_share}
    cpu_rows = [r for r in rows if r["model"] not in bound]
    cost: dict[str, float] = {}
    for feature in ("random", "min_tokens"):
        alone = [r["delta_ms"] for r in cpu_rows if KINDS.get(r["kind"]) == (feature,)]
        if alone:
            cost[feature] = statistics.mean(alone)
    both = [r["delta_ms"] for r in cpu_rows if KINDS.get(r["kind"]) == ("random", "min_tokens")]
    if both and not cost:  # only the bench's mix measured: all of it on the random sampler (see the docstring)
        cost = {"random": statistics.mean(both), "min_tokens": 0.0}
    elif both and len(cost) == 1:  # one part alone and the mix: the other part is the difference
        known = next(iter(cost))
        cost["min_tokens" if known == "random" else "random"] = max(0.0, statistics.mean(both) - cost[known])
    # A cost is applied only where the phases tell it from zero: mean > 2 standard errors (the small models'
    # speed also drifts within a boot, docs/CALIBRATION.md "Sampling cost"; a boot whose sampled phases ran
    # faster than its greedy ones says the difference was drift, not sampling).
    evidence: dict[str, list[float]] = {}
    for feature in cost:
        kinds = [k for k, f in KINDS.items() if feature in f and (len(f) == 1 or feature == "random")]
        evidence[feature] = [r["delta_ms"] for r in cpu_rows if r["kind"] in kinds]
    significant = {f: len(v) > 1 and statistics.mean(v) > 2 * statistics.stdev(v) / len(v) ** 0.5
                   for f, v in evidence.items()}  # fmt: skip
    cost = {f: (c if significant[f] else 0.0) for f, c in cost.items()}
    ref = profiles[reference]["step_time_s"]
    cpu = {"cpu_base": ref["base"], "cpu_per_seq": ref["decode_seqs"]}
    sections = {m: {k: round(v / 1e3, 7) for k, v in cost.items()} | (cpu if m in bound else {}) for m in profiles}
    checks = []
    for r in rows:
        sec = sections[r["model"]]
        extra = sum(sec.get(f, 0.0) for f in KINDS.get(r["kind"], ("random",))) * 1e3
        base = r["greedy_ms"]
        pred = max(base, (sec["cpu_base"] + sec["cpu_per_seq"] * r["batch"]) * 1e3 + extra) if "cpu_base" in sec \
            else base + extra  # fmt: skip
        checks.append(r | {"model_delta_ms": pred - base})
    return {"cost_ms": cost, "gpu_bound": sorted(bound), "sections": sections, "checks": checks,
            "evidence_ms": {f: (statistics.mean(v), statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else None, len(v))
                            for f, v in evidence.items() if v},
            "applied": any(cost.values()),
            "per_model_mean_delta_ms": {m: statistics.mean(r["delta_ms"] for r in rows if r["model"] == m)
                                        for m in sorted({r["model"] for r in rows})}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="*", default=None, help="co-location probes (default: data/colocate-h200*.json)")
    ap.add_argument("--profiles", default=str(PROFILES))
    ap.add_argument(
        "--gpu-bound-share",
        type=float,
        default=0.75,
        help="a worker whose gpu_share is at least this is GPU-bound (its step hides the CPU work)",
    )
    ap.add_argument(
        "--cpu-reference",
        default="qwen2.5-1.5b",
        help="the CPU-bound profile whose decode step is a GPU-bound worker's CPU time per step",
    )
    ap.add_argument("--date", default="2026-11-30")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    files = [Path(f) for f in a.data] if a.data else sorted(DATA.glob("colocate-h200*.json"))
    rows = [r | {"file": f.name} for f in files for r in pairs(json.loads(f.read_text()))]
    files = [f for f in files if any(r["file"] == f.name for r in rows)]
    if not rows:
        raise SystemExit("no probe with both greedy and another sampling of one worker alone")
    paths = {p.stem.removeprefix("h200-"): p for p in sorted(Path(a.profiles).glob("h200-*.json"))}
    profiles = {m: json.loads(p.read_text()) for m, p in paths.items()}
    res = fit(rows, profiles, a.gpu_bound_share, a.cpu_reference)
    print("| worker | batch | kind | greedy ms | kind ms | measured extra | model extra |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in res["checks"]:
        rel = 100 * r["delta_ms"] / r["greedy_ms"]
        print(f"| {r['model']} | {r['batch']} | {r['kind']} | {r['greedy_ms']:.2f} | {r['ms']:.2f} | "
              f"{r['delta_ms']:+.2f} ms ({rel:+.0f} %) | {r['model_delta_ms']:+.2f} ms |")  # fmt: skip
    print("per worker, mean measured extra (ms):", {m: round(v, 3) for m, v in res["per_model_mean_delta_ms"].items()})
    print("fitted cost (ms, on the CPU-bound workers):", {k: round(v, 3) for k, v in res["cost_ms"].items()},
          "| GPU-bound:", res["gpu_bound"])  # fmt: skip
    for f, (mean, se, n) in res["evidence_ms"].items():
        print(f"  {f}: mean extra {mean:+.3f} ms, standard error {se if se is None else round(se, 3)} ms, {n} phases")
    if not res["applied"]:
        print("not distinguishable from zero (mean <= 2 standard errors): no sampling_s in the profiles")
    for m, sec in res["sections"].items():
        print(f"  {m}: sampling_s {json.dumps(sec)}")
    if a.dry_run:
        return 0
    if not res["applied"]:
        for m, path in paths.items():
            prof = profiles[m]
            prof.pop("sampling_s", None)
            prof.get("provenance", {}).pop("sampling", None)
            path.write_text(json.dumps(prof, indent=1) + "\n")
            print(f"wrote {path} (no sampling_s)")
        return 0
    measured = {r["model"] for r in rows}
    separated = any(KINDS.get(r["kind"]) == ("min_tokens",) for r in rows)
    for m, path in paths.items():
        prof = profiles[m]
        prof["sampling_s"] = res["sections"][m]
        prof["provenance"]["sampling"] = {
            "status": "measured"
            if m in measured
            else "not measured: set as the other GPU-bound workers' (its longer GPU step hides the same CPU work)",
            "date": a.date,
            "vllm": "0.26.0",
            "gpu": "NVIDIA H200",
            "source": ", ".join(f"scripts/calibrate/data/{f.name}" for f in files)
            + " (colocate.py probe --alone --sampling ...: each worker decoding alone, 256-token prompts, "
            "300-token answers, greedy and the bench's sampling back to back on one boot)",
            "fit": "python scripts/calibrate/fit_sampling.py: random = mean extra TPOT of the CPU-bound workers "
            f"(gpu_share < {a.gpu_bound_share}) over their greedy phases; GPU-bound workers get cpu_base / "
            f"cpu_per_seq = {a.cpu_reference}'s step_time_s base / decode_seqs",
            "note": "random and min_tokens from the phases that carry one of them alone"
            if separated
            else "the probe's 'bench' requests carry temperature 1 and min_tokens together (as the bench's do on "
            "real vLLM); until a probe separates them (--sampling greedy,temp,mintok,bench) all of it is in "
            "'random', the part the simulated workers can see (the bench sends them no min_tokens)",
            "tpot_ms_greedy_then_kind": {
                f"{r['model']} b{r['batch']} {r['kind']} ({r['file']})": f"{r['greedy_ms']:.3f} {r['ms']:.3f}"
                for r in rows
            },
        }
        path.write_text(json.dumps(prof, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
