#!/usr/bin/env python3
"""Stage 4 of the calibration: refine a fitted profile's step-time terms on the probes themselves, run through the
simulator's own engine (replay.py), against the median of the real boots (compare.py's reference).

fit_profile.py fits the step model to engine steps it reconstructs from each probe (a TTFT is its prefill chunks,
a TPOT point its steady decode step). Several fidelity cells are not one kind of step: TPOT p50 of 128 prompts of
2,048 tokens sent at once is mostly decode steps stretched by the other requests' chunked prefill; a saturation
makespan or a prompt injected into a decoding batch mixes the two, queueing included. Here the terms are moved,
from the fit as the starting point, by least squares on log(sim / real) over every cell of the model (robust
soft-L1 loss), each cell simulated by the very engine the sim runs (a few hundred engine replays per model, ~1-2
min). A penalty holds each term near the fit (``--prior``, in log units), so a term the cells say nothing about
stays where the step-level fit put it.

Tuned (``--terms``, by default all nine): step_time_s.{base, prefill_tokens, decode_seqs, decode_context_tokens,
prefill_attn_mtok2}, cudagraph.{eager_floor_s, eager_extra_s}, overhead_s.ttft, frontend_s.per_request. Never tuned:
what other scripts fit (gpu_share, sampling_s, frontend_s.stream_*, per_prompt_token, measured directly).

The shipped profiles have only the five terms a decode step does not use tuned (the boot-weighted four-boot fit,
then ``--terms prefill_tokens,prefill_attn_mtok2,eager_floor_s,ttft,per_request``; docs/CALIBRATION.md "The TTFT
terms tuned"): the decode step stays the fit's, to which backends/sim/gpu.py's switch cost is fitted. Tuned on every
term, the small models come out faster than the fit, and on the real three-worker benches (one GPU, docs/REAL_VLLM.md
"Rerun 13") the sim was already too fast: the tuned sims put fewer bench cells within 10 % ("Five boots").

    python scripts/calibrate/fit_profile.py --weight median --out-dir /tmp/median   # stages 1-3, each point's median
    python scripts/calibrate/tune_replay.py --profiles /tmp/median --dry-run        # print the before/after cells
    python scripts/calibrate/tune_replay.py --profiles /tmp/median --out-dir /tmp/tuned
    python scripts/calibrate/tune_replay.py --profiles /tmp/median --hold-out mix,saturation,kv --dry-run
    python scripts/calibrate/tune_replay.py --profiles /tmp/fit4 --out-dir /tmp/ttft \
        --terms prefill_tokens,prefill_attn_mtok2,eager_floor_s,ttft,per_request      # the shipped profiles
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from backends.sim.profile import parse_profile  # noqa: E402
from scripts.calibrate import compare, replay  # noqa: E402

PROFILES = ROOT / "backends" / "sim" / "profiles"
# (section, key): the terms moved
TERMS = (
    ("step_time_s", "base"),
    ("step_time_s", "prefill_tokens"),
    ("step_time_s", "decode_seqs"),
    ("step_time_s", "decode_context_tokens"),
    ("step_time_s", "prefill_attn_mtok2"),
    ("cudagraph", "eager_floor_s"),
    ("cudagraph", "eager_extra_s"),
    ("overhead_s", "ttft"),
    ("frontend_s", "per_request"),
)
# a typical size of each term: its scale for the optimiser; a term fitted to 0 starts from 5 % of it, so it can move
SCALE = {"base": 1e-3, "prefill_tokens": 1e-6, "decode_seqs": 1e-5, "decode_context_tokens": 1e-8,
         "prefill_attn_mtok2": 1e-4, "eager_floor_s": 1e-2, "eager_extra_s": 1e-3, "ttft": 1e-3,
         "per_request": 1e-3}  # fmt: skip
# the kinds of cell (compare.py's names begin with them); "kv" is the small-KV 0.5B worker's pressure probe
KINDS = ("TTFT", "TPOT", "saturation", "mix", "kv")


def kind_of(cell: str) -> str:
    return "kv" if cell.startswith("KV") else cell.split(" ", 1)[0]


def with_terms(raw: dict, x: np.ndarray, terms: tuple[tuple[str, str], ...]) -> dict:
    q = json.loads(json.dumps(raw))
    for (sec, key), v in zip(terms, x, strict=True):
        q[sec][key] = float(f"{max(0.0, float(v)):.4g}")
    return q


def cells(raw: dict, model: str, real: dict, kv: dict | None, http_s: float, tmp: Path) -> list[dict]:
    """compare.py's rows for ``model`` (and the KV probe, for the 0.5B), the sim replayed with profile ``raw``."""
    prof = parse_profile(raw, f"h200-{model}")
    d1, d2 = replay.replay_model(prof, real, http_s)
    (tmp / f"sim-{model}-ttft.json").write_text(json.dumps(d1))
    (tmp / f"sim-{model}-load.json").write_text(json.dumps(d2))
    (tmp / "sim-kvsmall.json").write_text(json.dumps(replay.replay_kv(prof, kv, http_s) if kv else {}))
    ns = argparse.Namespace(out_dir=str(tmp), models=[model], repeats=True, boot="")
    return [r for r in compare.table(ns) if r["sim_err"] is not None and r["real"]]


def score(rows: list[dict]) -> str:
    within = sum(abs(r["sim_err"]) <= 0.10 for r in rows)
    return f"{within}/{len(rows)} within 10 %, median |err| {np.median([abs(r['sim_err']) for r in rows]):.1%}"


def tune(raw: dict, model: str, a: argparse.Namespace, tmp: Path) -> tuple[dict, list[dict], list[dict]]:
    real = json.loads((replay.DATA / f"probe-{model}.json").read_text())
    kv = json.loads((replay.DATA / "probe-kvsmall.json").read_text()).get("kv") if model == "qwen2.5-0.5b" else None
    http_s = a.sim_http_ms / 1e3
    held = set(a.hold_out)
    terms = a.terms
    x0 = np.array([raw[sec][key] for sec, key in terms], float)
    scale = np.array([SCALE[key] for _, key in terms])
    start = np.maximum(x0, 0.05 * scale)  # a term fitted to 0 gets a foothold

    def res(x: np.ndarray) -> np.ndarray:
        rows = [r for r in cells(with_terms(raw, x, terms), model, real, kv, http_s, tmp)
                if kind_of(r["cell"]) not in held]  # fmt: skip
        fit = [math.log(1.0 + r["sim_err"]) for r in rows]
        # penalty: each term's log distance from the step-level fit (from its foothold for a term fitted to 0)
        prior = [a.prior * math.log((max(v, 1e-3 * s) + s * 0.05) / (st + s * 0.05))
                 for v, st, s in zip(x, start, scale, strict=True)]  # fmt: skip
        return np.array(fit + prior)

    sol = least_squares(res, start, bounds=(0.0, np.inf), x_scale=scale, diff_step=0.02, loss="soft_l1",
                        f_scale=0.05, max_nfev=a.max_nfev)  # fmt: skip
    out = with_terms(raw, sol.x, terms)
    return out, cells(raw, model, real, kv, http_s, tmp), cells(out, model, real, kv, http_s, tmp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(replay.MODELS))
    ap.add_argument("--profiles", default=str(PROFILES), help="the fitted profiles to start from (a folder)")
    ap.add_argument("--out-dir", default="/tmp/chimera-tuned", help="where the tuned profiles go (not shipped)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--prior", type=float, default=0.05, help="weight of a term's log distance from the fit")
    ap.add_argument("--hold-out", default="", help=f"kinds of cell left out of the tuning, scored apart: {KINDS}")
    ap.add_argument(
        "--max-nfev",
        type=int,
        default=40,
        help="least-squares function evaluations per model (~ iterations: the Jacobian's are not counted)",
    )
    ap.add_argument("--sim-http-ms", type=float, default=3.0, help="as in replay.py")
    ap.add_argument(
        "--terms",
        default=",".join(key for _, key in TERMS),
        help="the terms moved (by key; the others stay as fitted), e.g. the ones a decode step does not use: "
        "prefill_tokens,prefill_attn_mtok2,eager_floor_s,ttft,per_request",
    )
    a = ap.parse_args()
    keys = [k for k in a.terms.split(",") if k]
    if bad := [k for k in keys if k not in SCALE]:
        ap.error(f"--terms: unknown term {bad[0]!r} (one of {', '.join(SCALE)})")
    a.terms = tuple(t for t in TERMS if t[1] in keys)
    a.hold_out = [k for k in a.hold_out.split(",") if k]
    if bad := [k for k in a.hold_out if k not in KINDS]:
        ap.error(f"--hold-out: unknown kind {bad[0]!r} (one of {', '.join(KINDS)})")
    every_before, every_after = [], []
    if not a.dry_run:
        Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        for model in [m for m in a.models.split(",") if m]:
            path = Path(a.profiles) / f"h200-{model}.json"
            raw = json.loads(path.read_text())
            out, before, after = tune(raw, model, a, Path(td))
            every_before += before
            every_after += after
            print(f"\n== {model}")
            for sec, key in a.terms:
                print(f"  {sec}.{key}: {raw[sec][key]:.4g} -> {out[sec][key]:.4g}")
            for b, r in zip(before, after, strict=True):
                tag = "  (held out)" if kind_of(r["cell"]) in a.hold_out else ""
                print(
                    f"  {r['model'] + ' ' + r['cell']:48s} real {r['real']:9.4g}  fit {b['sim_err']:+6.1%}"
                    f"  tuned {r['sim_err']:+6.1%}{tag}"
                )
            out["provenance"]["tuned"] = {
                "script": "scripts/calibrate/tune_replay.py", "prior": a.prior, "hold_out": a.hold_out,
                "fitted": {f"{sec}.{key}": raw[sec][key] for sec, key in a.terms},
                "cells": {"fit": score(before), "tuned": score(after)},
            }  # fmt: skip
            if not a.dry_run:
                dest = Path(a.out_dir) / path.name
                dest.write_text(json.dumps(out, indent=1) + "\n")
                print(f"  wrote {dest}")
    for name, rows in (("fit", every_before), ("tuned", every_after)):
        print(f"{name}: {score(rows)}")
        for k in a.hold_out:
            sel = [r for r in rows if kind_of(r["cell"]) == k]
            if sel:
                print(f"  held out {k}: {score(sel)}")


if __name__ == "__main__":
    main()
