#!/usr/bin/env python3
"""Fit simulator step-time profiles from the raw H200 probe results (scripts/calibrate/data/).

Every measured point is mapped onto the engine steps vLLM ran for it:

* TTFT of one prompt of n tokens (batch 1): ceil(n/8192) prefill chunks, plus the front end (a constant and
  ``frontend_s.per_prompt_token`` * n);
* steady decode at batch b: one step with decode_seqs = b and decode_context_tokens = b * (prompt + generated);
* a prompt injected into a 32-stream decode batch (the "mix" probe): the decoders' largest inter-token gap is one
  mixed step: prefill chunk min(L, 8192 - 32) + 32 decoding sequences.

A step of more than 128 scheduled tokens (vLLM's --max-cudagraph-capture-size) runs without CUDA graphs and lasts
max(linear, cudagraph.eager_floor_s) + eager_extra_s + eager_per_token_s * tokens. The fit has three stages
(see docs/CALIBRATION.md, "The fit"): 1. the linear model + TTFT constant by NNLS on the TTFT and <= 128-sequence
decode points (relative error, groups balanced, and within a group each boot of the server counting once), the
front end's per-token cost (measured directly: client TTFT minus vLLM's request_prefill_time, over prompt length)
taken off first; 2. the eager terms on the > 128-sequence decode and mixed steps, linear part fixed; 3.
frontend_s.per_request from run 1's 256-request burst.

Boots: run 1 (probe-*.json), run 2 (probe2-*.json; later boots of the same sweeps: probe3-*.json, ...) and the
co-location probes' "alone" phases (colocate-h200*.json: one worker decoding at batch 1, 8, 32, its neighbours idle)
were each measured on another boot of the same servers. The small models' decode step differs by 20-40 % between
boots (their steps are CPU-bound), and run 2 has 2.6x as many decode points as run 1, so a fit by point follows
run 2, the fastest boot (docs/CALIBRATION.md, "Boots"); ``--weight point --no-colocate`` gives that fit back.
``--weight median`` fits each point once, at the median of the boots that measured it (the fidelity table's
reference); tune_replay.py's all-terms tuning starts from it (docs/CALIBRATION.md, "Five boots"; neither is shipped:
the shipped profiles are the ``--weight boot`` fit with only its TTFT terms tuned, "The TTFT terms tuned").

    python scripts/calibrate/fit_profile.py                # writes backends/sim/profiles/h200-*.json
    python scripts/calibrate/fit_profile.py --dry-run      # print the fit only
    python scripts/calibrate/fit_profile.py --weight point --no-colocate   # the fit of 2026-11-29 (run 2 dominates)
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
PROFILES = ROOT / "backends" / "sim" / "profiles"
sys.path.insert(0, str(ROOT))
MODELS = {"qwen2.5-0.5b": 0.45, "qwen2.5-1.5b": 0.60, "qwen2.5-7b": 0.78, "qwen2.5-14b": 0.85}
BUDGET = 8192            # max_num_batched_tokens (vLLM default on a >= 70 GiB GPU)
GRAPH_MAX = 128          # --max-cudagraph-capture-size
FEATURES = ("base", "prefill_tokens", "decode_seqs", "decode_context_tokens", "prefill_attn_mtok2")
COLS = (*FEATURES, "ovh_ttft")
DECODE_SEQS = FEATURES.index("decode_seqs")
# the fitted model: the linear step features, the TTFT constant, and vLLM's eager-step cost (a step of more than
# GRAPH_MAX scheduled tokens: eager_extra = 1, eager_tokens = its tokens); ttft_per_prompt_token is not fitted
# by NNLS but measured directly (front_slope) and taken off the TTFT targets
EXT_COLS = (*COLS, "eager_extra", "eager_tokens", "ttft_per_prompt_token")
NNLS_COLS = EXT_COLS[:-1]
# vLLM's API server is one process that takes requests one at a time: a burst of b requests reaches the engine
# over b * (FE_SERIAL + ttft_per_prompt_token * prompt) seconds (TTFT max of the 0.5B/1.5B bursts, run 1: 2.2-2.9 ms
# per request beyond the per-token part; the larger models are engine-bound there and do not show it).
FE_SERIAL = 0.0025
# Published Qwen2.5 shapes (as .gpu/bin/mkmodels.py writes them): layers, hidden, intermediate, KV width.
SHAPES = {"qwen2.5-0.5b": (24, 896, 4864, 128), "qwen2.5-1.5b": (28, 1536, 8960, 256),
          "qwen2.5-7b": (28, 3584, 18944, 512), "qwen2.5-14b": (48, 5120, 13824, 1024)}


def attn_ratio(model: str) -> float:
    """Attention FLOPs per (token x context position), per 1e6, over linear-layer FLOPs per token.

    The extended fit ties prefill_attn_mtok2 = ratio * prefill_tokens: with only single prompts up to 12k tokens
    the two columns are nearly collinear, and a free fit puts most of the prefill cost on attention.
    """
    layers, d, inter, kv = SHAPES[model]
    linear = 2 * layers * (2 * d * d + 2 * d * kv + 3 * d * inter)
    return 4 * layers * d / linear * 1e6


def prefill_steps(n: int, start: int = 0, budget: int = BUDGET) -> list[tuple[int, int]]:
    """(chunk_start, chunk_len) of each chunked-prefill step of an n-token prompt alone on the engine."""
    out, pos = [], start
    while pos < n:
        c = min(budget, n - pos)
        out.append((pos, c))
        pos += c
    return out


def row(**kw: float) -> dict[str, float]:
    return {c: float(kw.get(c, 0.0)) for c in EXT_COLS}


def step(**kw: float) -> tuple[np.ndarray, int]:
    """One engine step: its linear features (FEATURES order) and its scheduled tokens."""
    x = np.array([float(kw.get(c, 0.0)) for c in FEATURES])
    return x, int(kw.get("prefill_tokens", 0) + kw.get("decode_seqs", 0))


# parameters of the full model, fitted jointly by nonlinear least squares (scipy least_squares)
PARAMS = (*FEATURES, "ovh_ttft", "eager_floor", "eager_extra", "eager_per_token")


def model_y(r: dict, p: np.ndarray, per_token: float) -> float:
    """What the simulator's step model predicts for a row: its steps (eager ones: max(linear, floor) + extra +
    per_token * tokens), plus, for a TTFT, the front end's constant and per-prompt-token cost."""
    lin_c, ovh, floor, extra, ptok = p[:5], p[5], p[6], p[7], p[8]
    y = 0.0
    for x, tokens in r["steps"]:
        d = float(lin_c @ x)
        if tokens > GRAPH_MAX:  # eager_extra_decode_only: a step that decodes nothing pays no eager_extra
            d = max(d, floor) + (extra if x[DECODE_SEQS] > 0 else 0.0) + ptok * tokens
        y += d
    if r["kind"] == "ttft":
        y += ovh + per_token * r["n"]
    return y


def fit_full(rows: list[dict], per_token: float, tie: float, x0: np.ndarray) -> np.ndarray:
    """Relative-error least squares of the full model over every row with ``fit`` (groups balanced)."""
    from scipy.optimize import least_squares

    fr = [r for r in rows if r["fit"]]
    kinds = [r["kind"] for r in fr]
    w = np.array([1.0 / math.sqrt(kinds.count(k)) for k in kinds])
    ia, ip = FEATURES.index("prefill_attn_mtok2"), FEATURES.index("prefill_tokens")

    def expand(q: np.ndarray) -> np.ndarray:
        p = q.copy()
        if tie:
            p[ia] = tie * p[ip]
        return p

    def res(q: np.ndarray) -> np.ndarray:
        p = expand(q)
        return np.array([(model_y(r, p, per_token) / r["y"] - 1) for r in fr]) * w

    scale = np.array([1e-3, 1e-5, 1e-5, 1e-8, 1e-3, 1e-2, 1e-2, 1e-2, 1e-5])
    sol = least_squares(res, np.maximum(x0, 0.0), bounds=(0.0, np.inf), x_scale=scale, loss="soft_l1", f_scale=0.1)
    return expand(sol.x)


def fit_eager(rows: list[dict], lin: np.ndarray, per_token: float, with_mix: bool = True) -> np.ndarray:
    """Stage 2: eager_floor, eager_extra, eager_per_token on the eager decode (and mixed) steps, the linear
    coefficients ``lin`` (FEATURES + ovh_ttft) held fixed. Returns the full PARAMS vector."""
    from scipy.optimize import least_squares

    fr = [r for r in rows if r["kind"] == "eager" or (with_mix and r["kind"] == "mix")]

    def full(q: np.ndarray) -> np.ndarray:
        return np.array([*lin[:6], *q])

    def res(q: np.ndarray) -> np.ndarray:
        return np.array([model_y(r, full(q), per_token) / r["y"] - 1 for r in fr])

    sol = least_squares(res, np.array([0.01, 0.01, 0.0]), bounds=(0.0, np.inf), x_scale=np.array([1e-2, 1e-2, 1e-5]),
                        loss="soft_l1", f_scale=0.1)
    return full(sol.x)


def ttft_row(n: int, y_ms: float, key: str, server_prefill_ms: float | None = None) -> dict:
    chunks = prefill_steps(n)
    r = row(base=len(chunks), prefill_tokens=n, prefill_attn_mtok2=sum(c * (s + c / 2) for s, c in chunks) / 1e6,
            ovh_ttft=1, eager_extra=sum(1 for _, c in chunks if c > GRAPH_MAX),
            eager_tokens=sum(c for _, c in chunks if c > GRAPH_MAX), ttft_per_prompt_token=n)
    # client TTFT minus vLLM's own "scheduled -> first token" time: front end + queueing outside the engine step
    front = (y_ms - server_prefill_ms) / 1e3 if server_prefill_ms else None
    steps = [step(base=1, prefill_tokens=c, prefill_attn_mtok2=c * (s + c / 2) / 1e6) for s, c in chunks]
    return {"kind": "ttft", "key": key, "x": r, "y": y_ms / 1e3, "fit": True, "front": front, "n": n, "steps": steps}


def decode_row(b: int, ctx_mid: float, y_ms: float, key: str) -> dict:
    eager = b > GRAPH_MAX
    r = row(base=1, decode_seqs=b, decode_context_tokens=b * ctx_mid, eager_extra=int(eager), eager_tokens=b * eager)
    return {"kind": "eager" if eager else "decode", "key": key + (" (eager)" if eager else ""), "x": r,
            "y": y_ms / 1e3, "fit": not eager,
            "steps": [step(base=1, decode_seqs=b, decode_context_tokens=b * ctx_mid)]}


def colocate_rows(colocate: dict, model: str, boot: str = "c") -> list[dict]:
    """Decode rows of the co-location probe's phases in which ``model`` ran alone (its neighbours idle): server-side
    mean inter-token time of ``batch`` closed-loop users, prompt P, answers of T tokens (mid-answer context P + T/2)."""
    ctx = colocate["prompt"] + colocate["tokens"] / 2
    return [decode_row(ph["batch"], ctx, ph["tpot_ms"][model], f"{boot} decode b{ph['batch']} p{colocate['prompt']}")
            for ph in colocate["phases"]
            if ph["subset"] == [model] and ph["batch"] <= GRAPH_MAX and ph.get("sampling", "greedy") == "greedy"]


def boot_of(r: dict) -> str:
    """Which boot of the server a row was measured on: "r1", "r2" (both reps of run 2) or "c" (the co-location
    probe)."""
    return r["key"].split(" ", 1)[0].split(".", 1)[0]


def median_rows(rows: list[dict]) -> list[dict]:
    """One row per measured point (its name without the boot): the median over the boots that measured it, with the
    features of the boot nearest that median (its context length, its chunking). The fidelity table's reference is
    this median (compare.py), so a fit to it is not pulled toward the slow boots."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["kind"], r["key"].split(" ", 1)[1]), []).append(r)
    out = []
    for (_, name), g in groups.items():
        y = float(np.median([r["y"] for r in g]))
        near = min(g, key=lambda r: abs(r["y"] - y))
        out.append(dict(near, key=f"m {name}", y=y, boots=len(g)))
    return out


def build_rows(runs: list[dict]) -> list[dict]:
    """Feature rows of every measured point of one model (run 1: probe-*.json, run 2: probe2-*.json)."""
    rows = []
    for i, d in enumerate(runs, 1):
        for t in d.get("ttft", []):
            if isinstance(t.get("ttft_ms"), float) and math.isfinite(t["ttft_ms"]):
                rows.append(ttft_row(t["prompt"], t["ttft_ms"], f"r{i} ttft p{t['prompt']}",
                                     t.get("server_prefill_ms")))
        for t in d.get("psweep", []):
            if not t.get("as_ids") and math.isfinite(t["ttft_ms"]):
                rows.append(ttft_row(t["prompt"], t["ttft_ms"], f"r{i} ttft p{t['prompt']}",
                                     t.get("server_prefill_ms")))
        for t in d.get("tpot", []):
            st = t.get("steady")
            if st and st.get("step_ms"):
                rows.append(decode_row(t["batch"], st["ctx_mid"], st["step_ms"],
                                       f"r{i} decode b{t['batch']} p{t['prompt']}"))
        for t in d.get("dsweep", []):
            if t.get("steady_step_ms"):
                rows.append(decode_row(t["batch"], t["steady_ctx_mid"], t["steady_step_ms"],
                                       f"r{i}.{t['rep']} decode b{t['batch']} p{t['prompt']}"))
        mix = d.get("mix") or {}
        for inj in mix.get("inject", []):
            if not inj.get("max_gap_ms"):
                continue
            b, L = mix["batch"], inj["prompt"]
            c = min(L, BUDGET - b)
            eager = c + b > GRAPH_MAX
            r = row(base=1, prefill_tokens=c, prefill_attn_mtok2=c * c / 2 / 1e6, decode_seqs=b,
                    decode_context_tokens=b * inj["ctx_at_gap"], eager_extra=int(eager), eager_tokens=(c + b) * eager)
            rows.append({"kind": "mix", "key": f"r{i} mix b{b}+p{L}", "x": r, "y": inj["max_gap_ms"] / 1e3,
                         "fit": True, "steps": [step(base=1, prefill_tokens=c, prefill_attn_mtok2=c * c / 2 / 1e6,
                                                     decode_seqs=b, decode_context_tokens=b * inj["ctx_at_gap"])]})
        st = ((d.get("saturation") or {}).get("stream") or {}).get("steady")
        if st and st.get("step_ms"):
            sat = d["saturation"]["stream"]
            rows.append(decode_row(sat["streams"], st["ctx_mid"], st["step_ms"],
                                   f"r{i} decode b{sat['streams']} p{sat['prompt']}"))
    return rows


def front_slope(rows: list[dict]) -> float:
    """Seconds of front-end cost per prompt token: slope of (client TTFT - vLLM prefill time) over prompt length."""
    pts = [(r["n"], r["front"]) for r in rows if r.get("front") is not None]
    if len(pts) < 3:
        return 0.0
    n = np.array([p[0] for p in pts], float)
    f = np.array([p[1] for p in pts], float)
    k = np.polyfit(n, f, 1)[0]
    return max(0.0, float(k))


def fit(rows: list[dict], cols: tuple[str, ...], use_all: bool = False, per_token: float = 0.0,
        tie_attn: float = 0.0, by_boot: bool = False) -> np.ndarray:
    """NNLS on relative error. per_token: a fixed ttft_per_prompt_token taken off the TTFT targets first;
    tie_attn: if set, prefill_attn_mtok2 = tie_attn * prefill_tokens (one fitted column for both); by_boot: within
    each kind of point, every boot weighs the same however many points it has."""
    fr = [r for r in rows if r["fit"] or use_all]
    if tie_attn:
        ip, ia = cols.index("prefill_tokens"), cols.index("prefill_attn_mtok2")
        A = np.array([[r["x"][c] + (tie_attn * r["x"]["prefill_attn_mtok2"] if i == ip else 0.0)
                       for i, c in enumerate(cols)] for r in fr])
        A[:, ia] = 0.0
    else:
        A = np.array([[r["x"][c] for c in cols] for r in fr])
    y = np.array([r["y"] - per_token * r["x"]["ttft_per_prompt_token"] for r in fr])
    w = 1.0 / y  # relative error
    # balance the groups so that the 10 decode points do not outvote the 2 mixed-step points
    kinds = [r["kind"] for r in fr]
    for k in set(kinds):
        idx = [i for i, kk in enumerate(kinds) if kk == k]
        if not by_boot:
            w[idx] *= 1.0 / math.sqrt(len(idx))
            continue
        boots = [boot_of(fr[i]) for i in idx]
        for i, b in zip(idx, boots, strict=True):  # squared weights of a kind sum to 1, each boot's to 1 / boots
            w[i] *= 1.0 / math.sqrt(len(set(boots)) * boots.count(b))
    coef, _ = nnls(A * w[:, None], y * w)
    if tie_attn:
        coef[cols.index("prefill_attn_mtok2")] = tie_attn * coef[cols.index("prefill_tokens")]
    return coef


def predict(r: dict, coef: np.ndarray, cols: tuple[str, ...]) -> float:
    return float(sum(coef[i] * r["x"][c] for i, c in enumerate(cols)))


def compact_points(runs: list[dict]) -> dict:
    """The measured points a profile keeps (a few KB; the full results stay in scripts/calibrate/data/)."""
    d = runs[0]
    r2 = runs[1] if len(runs) > 1 else {}
    r = lambda x: None if x is None else round(x, 3)  # noqa: E731
    out: dict = {"first_request_ttft_ms": r((d.get("warmup") or {}).get("first_request_ttft_ms"))}
    ttft = [t for t in d.get("ttft", []) if isinstance(t.get("ttft_ms"), float) and math.isfinite(t["ttft_ms"])]
    out["ttft_ms"] = {str(t["prompt"]): r(t["ttft_ms"]) for t in ttft}
    out["server_ttft_ms"] = {str(t["prompt"]): r(t["server_ttft_ms"]) for t in ttft if t.get("server_ttft_ms")}
    out["psweep_ttft_ms"] = {str(t["prompt"]) + ("ids" if t["as_ids"] else ""): r(t["ttft_ms"])
                             for t in r2.get("psweep", [])}
    out["tpot"] = {"columns": ["prompt", "batch", "tpot_ms_p50", "steady_step_ms", "ttft_ms_p50", "out_tok_s",
                               "makespan_s", "engine_steps"],
                   "rows": [[t["prompt"], t["batch"], r(t["tpot_ms_p50"]), r((t.get("steady") or {}).get("step_ms")),
                             r(t["ttft_ms_p50"]), r(t["out_tok_s"]), r(t["makespan_s"]),
                             t["metrics_delta"].get("vllm:iteration_tokens_total_count")] for t in d.get("tpot", [])]}
    out["dsweep"] = {"columns": ["rep", "prompt", "batch", "steady_step_ms", "server_itl_ms"],
                     "rows": [[t["rep"], t["prompt"], t["batch"], r(t["steady_step_ms"]), r(t["server_itl_ms"])]
                              for t in r2.get("dsweep", [])]}
    out["mix"] = [{"batch": m["batch"], "decode_out": m["decode_out"], "baseline_itl_ms": r(m["baseline_itl_ms"]),
                   "inject": [{k: (r(v) if isinstance(v, float) else v) for k, v in i.items()} for i in m["inject"]]}
                  for m in (d.get("mix"), r2.get("mix")) if m]
    out["saturation"] = {m: {k: (r(v) if isinstance(v, float) else v) for k, v in s.items()
                             if k in ("streams", "prompt", "out", "makespan_s", "out_tok_s", "e2e_s_p50", "e2e_s_p99")}
                         for m, s in (d.get("saturation") or {}).items()}
    return out


def fit_frontend(prof: dict, runs: list[dict]) -> float:
    """frontend_s.per_request from the warm-up burst of run 1 and its repeats (their median makespan): 256
    non-streaming requests of 64 + 16 tokens sent at once, which real vLLM completes in ~0.7-1.6 s, almost all of it
    its API server taking the requests one at a time.
    per_request = (burst makespan - the engine's own time for that burst, simulated without a front end) / 256
    - per_prompt_token * 64."""
    from backends.sim.profile import parse_profile
    from scripts.calibrate.replay import Run

    bursts = [(r.get("warmup") or {}).get("burst256_makespan_s") for r in runs]
    bursts = [b for b in bursts if b]
    if not bursts:
        return 0.0
    mk = float(np.median(bursts))  # every boot that ran the burst (run 1 and its repeats), the median
    q = json.loads(json.dumps(prof))
    q.pop("frontend_s", None)
    engine_s = max(Run(parse_profile(q), [(0.0, 64, 16)] * 256).go().done_seen)
    return max(0.0, (mk - engine_s) / 256 - prof["frontend_s"]["per_prompt_token"] * 64)


def keep_fitted_elsewhere(prof: dict, shipped: Path) -> None:
    """Carry over what other scripts fit into the shipped profile (``gpu_share``: colocate.py fit; ``sampling_s``:
    fit_sampling.py; ``frontend_s.stream_*``: fit_stream.py), which this fit does not touch."""
    if not shipped.exists():
        return
    old = json.loads(shipped.read_text())
    for key, prov in (("gpu_share", "gpu_share"), ("sampling_s", "sampling")):
        if key in old:
            prof[key] = old[key]
            if prov in old.get("provenance", {}):
                prof["provenance"][prov] = old["provenance"][prov]
    for key in ("stream_token", "stream_wait"):
        if key in old.get("frontend_s", {}):
            prof["frontend_s"][key] = old["frontend_s"][key]
    if "stream" in old.get("provenance", {}):
        prof["provenance"]["stream"] = old["provenance"]["stream"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--out-dir", default=str(PROFILES))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--no-mix", action="store_true", help="leave the mixed prefill+decode steps out of the fit")
    ap.add_argument("--alternate", type=int, default=0,
                    help="stage 1 / stage 2 alternations (stage 1 refitted on TTFTs net of the eager per-token cost)")
    ap.add_argument("--tie-attn", action="store_true",
                    help="tie prefill_attn_mtok2 to prefill_tokens by the model's attention/linear FLOP ratio")
    ap.add_argument("--weight", choices=("boot", "median", "point"), default="boot",
                    help="stages 1 and 2: every boot of the server weighing the same within a kind of point (default; "
                         "the shipped profiles, fitted before boot 5: --data a copy of data/ without boot5-*); every "
                         "point once, at the median of the boots that measured it (what tune_replay.py starts from; "
                         "docs/CALIBRATION.md, \"Five boots\"); or every point of every boot (the fit before "
                         "2026-11-30, which run 2's many decode points dominate)")
    ap.add_argument("--no-colocate", action="store_true",
                    help="leave out the co-location probes' alone phases (data/colocate-h200*.json)")
    ap.add_argument("--sim-http-ms", type=float, default=3.0,
                    help="the simulated worker's own HTTP/SSE cost per first token (measured on the 2-core dev box), "
                         "taken off the fitted client-side TTFT overhead so that it is not counted twice")
    a = ap.parse_args()
    data = Path(a.data)
    summary = json.loads((data / "summary.json").read_text())
    kvsmall = json.loads((data / "probe-kvsmall.json").read_text()) if (data / "probe-kvsmall.json").exists() else {}
    # co-location probes of real workers (one per boot: colocate-h200.json is boot "c", colocate-h200-<x>.json
    # "c<x>"), their phases with one worker busy
    probes = {} if a.no_colocate else {"c" + f.stem.removeprefix("colocate-h200").lstrip("-"): json.loads(f.read_text())
                                       for f in sorted(data.glob("colocate-h200*.json"))}  # fmt: skip
    sim_http = a.sim_http_ms / 1e3
    if not a.dry_run:
        Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    for model, quality in MODELS.items():
        d = json.loads((data / f"probe-{model}.json").read_text())
        # run 2 and any later boot of the run-2 sweeps (TAG=probe3 ... of run_h200.sh): rows r2, r3, ...
        later = sorted(data.glob(f"probe[2-9]-{model}.json"))
        # later boots of run 1's probes (TAG=boot2-probe ... of run_h200.sh, 2026-11-30): rows r<next>, ...
        repeats = sorted(data.glob(f"boot[0-9]*-probe-{model}.json"))
        runs = [d] + [json.loads(f.read_text()) for f in later + repeats]
        rows = build_rows(runs)
        for boot, colocate in probes.items():
            if model in {m for ph in colocate["phases"] for m in ph["subset"]}:
                rows += colocate_rows(colocate, model, boot)
        for r in rows:  # the new model expresses every point: fit them all (mixed steps unless --no-mix)
            r["fit"] = not (a.no_mix and r["kind"] == "mix")
        plain = fit([dict(r, fit=r["kind"] in ("ttft", "decode")) for r in rows], COLS)  # the old 5-term model
        k = front_slope(rows)
        # stage 1: the linear step model and the TTFT constant on the points that run inside CUDA graphs or are
        # dominated by prefill (TTFT, decode <= 128 sequences), the front end's per-token cost taken off first;
        # stage 2: the eager-step terms on the steps of more than 128 tokens (decode > 128, mixed steps), the
        # linear part held fixed; stage 3 (below): frontend_s.per_request from the 256-request burst.
        by_boot = a.weight == "boot"
        fitted = median_rows(rows) if a.weight == "median" else rows
        lin = fit([dict(r, fit=r["kind"] in ("ttft", "decode")) for r in fitted], COLS, per_token=k,
                  tie_attn=attn_ratio(model) if a.tie_attn else 0.0, by_boot=by_boot)
        coef = fit_eager(fitted, lin, k, with_mix=not a.no_mix)
        for _ in range(a.alternate):  # refit stage 1 with the TTFT chunks' eager per-token cost taken off, then stage 2
            ptok = coef[8]
            adj = [dict(r, y=r["y"] - (ptok * r["x"]["eager_tokens"] if r["kind"] == "ttft" else 0.0),  # no extra:
                        # a TTFT's steps decode nothing (eager_extra_decode_only)
                        fit=r["kind"] in ("ttft", "decode")) for r in fitted]
            lin = fit(adj, COLS, per_token=k, tie_attn=attn_ratio(model) if a.tie_attn else 0.0, by_boot=by_boot)
            coef = fit_eager(fitted, lin, k, with_mix=not a.no_mix)
        print(f"\n== {model}")
        print("  " + "  ".join(f"{c}={v:.4g}" for c, v in zip(PARAMS, coef, strict=True)) + f"  fe_per_token={k:.4g}")
        print(f"  {'point':30s} {'measured ms':>11s} {'fit ms':>9s} {'err':>7s}   {'5-term':>8s} {'err':>7s}")
        errs, perrs, fit_rows = [], [], []
        for r in rows:
            pe, pp = model_y(r, coef, k), predict(r, plain, COLS)
            e, ep = (pe - r["y"]) / r["y"], (pp - r["y"]) / r["y"]
            errs.append(abs(e))
            perrs.append(abs(ep))
            print(f"  {r['key']:30s} {r['y'] * 1e3:11.2f} {pe * 1e3:9.2f} {e:+7.1%}   {pp * 1e3:8.2f} {ep:+7.1%}"
                  + ("" if r["fit"] else "  (not fitted)"))
            fit_rows.append({"point": r["key"], "kind": r["kind"], "measured_ms": round(r["y"] * 1e3, 3),
                             "fit_ms": round(pe * 1e3, 3), "rel_err": round(e, 4), "in_fit": r["fit"],
                             "plain_fit_ms": round(pp * 1e3, 3)})
        by_kind = {}
        for kind in ("ttft", "decode", "eager", "mix"):
            sel = [x for x in fit_rows if x["kind"] == kind]
            if sel:
                by_kind[kind] = {"n": len(sel),
                                 "mean_abs_rel_err": round(float(np.mean([abs(x["rel_err"]) for x in sel])), 4),
                                 "plain_mean_abs_rel_err": round(float(np.mean(
                                     [abs(x["plain_fit_ms"] / x["measured_ms"] - 1) for x in sel])), 4)}
        print("  by kind: " + ", ".join(f"{kk} n={v['n']} {v['mean_abs_rel_err']:.1%} "
                                        f"(5-term {v['plain_mean_abs_rel_err']:.1%})" for kk, v in by_kind.items()))
        print(f"  fit: mean |err| {np.mean(errs):.1%}, max {np.max(errs):.1%} over {len(errs)} points "
              f"(5-term model: mean {np.mean(perrs):.1%}, max {np.max(perrs):.1%})")
        kv = summary["workers"].get(model, {}).get("kv_tokens")
        c = dict(zip(PARAMS, coef, strict=True))
        g = lambda v: float(f"{v:.4g}")  # noqa: E731
        prof = {
            "name": f"h200-{model}", "model": model, "quality": quality,
            "kv_budget_tokens": kv, "block_size": 16, "max_num_seqs": 1024, "max_num_batched_tokens": BUDGET,
            "max_model_len": 16384,
            "step_time_s": {f: g(c[f]) for f in FEATURES},
            "cudagraph": {"max_tokens": GRAPH_MAX, "eager_floor_s": g(c["eager_floor"]),
                          "eager_extra_s": g(c["eager_extra"]), "eager_per_token_s": g(c["eager_per_token"]),
                          "eager_extra_decode_only": True},
            "frontend_s": {"per_request": 0.0, "per_prompt_token": g(k)},
            "overhead_s": {"ttft": g(max(0.0, c["ovh_ttft"] - sim_http))},
        }
        fe = fit_frontend(prof, runs)
        prof["frontend_s"]["per_request"] = g(fe)
        prof["overhead_s"]["ttft"] = g(max(0.0, c["ovh_ttft"] - sim_http - fe))
        prof["overhead_s"]["sim_http"] = sim_http  # wall time: the sim adds back what a speedup < 1 shrinks of it
        # The measured servers ran vLLM 0.26's default async scheduler (their logs; docs/CALIBRATION.md "Async
        # scheduling"). It costs a request one step only when it reaches a busy engine, so the lone-request points
        # fitted above do not contain it (and the burst behind fit_frontend reaches an idle engine at once).
        prof["async_scheduling"] = True
        print(f"  frontend: per_request {fe * 1e3:.2f} ms (256-request burst), "
              f"per_prompt_token {k * 1e6:.2f} us; overhead_s.ttft {prof['overhead_s']['ttft'] * 1e3:.2f} ms")
        prof.update({
            "provenance": {"status": "measured", "date": d["meta"]["started"][:10], "vllm": "0.26.0",
                           "gpu": "NVIDIA H200",
                           "flags": f"--model /tmp/models/{model} --load-format dummy --dtype bfloat16 "
                                    + summary["flags"].split("--load-format dummy --dtype bfloat16 ", 1)[-1]
                                    + " (defaults: max_num_seqs 1024, max_num_batched_tokens 8192, chunked "
                                      "prefill, prefix caching, async scheduling, CUDA graphs FULL_AND_PIECEWISE "
                                      "sizes 1..128)",
                           "script": "scripts/calibrate/run_h200.sh + probe.py; fit: scripts/calibrate/fit_profile.py",
                           "fit": {"client_ttft_constant_fitted_s": g(c["ovh_ttft"]),
                                   "sim_http_overhead_subtracted_s": sim_http,
                                   "frontend_per_request_from": "warmup.burst256_makespan_s (run 1 and its "
                                                                 "repeats, the median)",
                                   "mixed_steps_fitted": not a.no_mix, "attn_tied": a.tie_attn,
                                   "weight": {"median": "each point once, the median of its boots",
                                              "boot": "each boot once per kind of point",
                                              "point": "each point of each boot"}[a.weight],
                                   "boots": sorted({boot_of(r) for r in rows}),
                                   "mean_abs_rel_err": round(float(np.mean(errs)), 4),
                                   "max_abs_rel_err": round(float(np.max(errs)), 4), "points": len(errs),
                                   "by_kind": by_kind}},
            "raw": {
                "source": f"scripts/calibrate/data/probe-{model}.json (run 1)"
                          + "".join(f", {f.name} (run {i})" for i, f in enumerate(later + repeats, 2))
                          + (", colocate-h200*.json (c...: the phases it ran alone)"
                             if any(boot_of(r).startswith("c") for r in rows) else ""),
                "points": compact_points(runs),
                "fit_rows": {"columns": ["point", "measured_ms", "fit_ms", "rel_err", "in_fit", "plain_fit_ms"],
                             "rows": [[r["point"], r["measured_ms"], r["fit_ms"], r["rel_err"], r["in_fit"],
                                       r["plain_fit_ms"]] for r in fit_rows]},
                "plain_fit": {
                    "note": "the 5-term model without cudagraph/frontend_s (the profile format before 2026-11-29), "
                            "fitted to the TTFT and <=128-sequence decode points only, for reference",
                    "coef": {cc: g(v) for cc, v in zip(COLS, plain, strict=True)},
                    "mean_abs_rel_err": round(float(np.mean(perrs)), 4)},
            },
        })
        if model == "qwen2.5-0.5b" and kvsmall.get("kv"):
            kvd = kvsmall["kv"]
            prof["raw"]["kv_pressure"] = {kk: v for kk, v in kvd.items()
                                          if kk not in ("metrics_delta", "cache_config", "polls")}
            prof["raw"]["kv_pressure"]["flags"] = summary.get("small_kv_flags")
        if not a.dry_run:
            p = Path(a.out_dir) / f"h200-{model}.json"
            keep_fitted_elsewhere(prof, PROFILES / f"h200-{model}.json")
            p.write_text(json.dumps(prof, indent=1) + "\n")
            print(f"  wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p} ({p.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
