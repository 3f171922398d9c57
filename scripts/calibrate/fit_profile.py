#!/usr/bin/env python3
"""Fit the simulator's step-time profile of one model from probe.py's results (one file per boot of the server).

Every measured point is mapped onto the engine steps vLLM ran for it:

* TTFT of one prompt of n tokens (batch 1): ceil(n / 8192) prefill chunks, plus the front end (a constant and
  ``frontend_s.per_prompt_token`` x n);
* steady decode at batch b: one step with decode_seqs = b and decode_context_tokens = b x (prompt + generated);
* a prompt injected into a decoding batch (the ``mix`` phase): the decoders' largest inter-token gap is one mixed
  step, prefill chunk min(L, 8192 - b) + b decoding sequences.

A step of more than 128 scheduled tokens (vLLM's --max-cudagraph-capture-size) runs without CUDA graphs and lasts
max(linear, cudagraph.eager_floor_s) + eager_extra_s + eager_per_token_s x tokens. Three stages: 1. the linear step
model and the TTFT constant by NNLS on the TTFT and <= 128-sequence decode points (relative error, the kinds of
point balanced, and within a kind each boot of the server counting once: ``--weight point`` counts every point),
the front end's per-token cost (client TTFT minus vLLM's request_prefill_time, over prompt length) taken off
first; 2. the eager terms on the > 128-sequence decode and mixed steps, the linear part fixed; 3.
``frontend_s.per_request`` from the warm-up's burst of 256 requests, replayed through the simulator's engine.
Co-location probes (``--colocate``) add the decode points of the phases in which this model ran alone.

    python scripts/calibrate/fit_profile.py --model qwen2.5-0.5b probe.json [probe-boot2.json ...] --out p.json
    chimera sim --profile p.json ...                          # or `profile: p.json` in a config

The shipped profiles' step terms come from the committed H200 probes (``scripts/calibrate/data``; their TTFT terms
were then tuned on the probes replayed through the engine: the profiles' ``provenance.tuned``), e.g. for the 7B::

    D=scripts/calibrate/data
    python scripts/calibrate/fit_profile.py --model qwen2.5-7b --quality 0.78 --dry-run $D/probe-qwen2.5-7b.json \\
        $D/probe2-qwen2.5-7b.json $D/boot[234]-probe-qwen2.5-7b.json --colocate $D/colocate-h200*.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares, nnls

from backends.sim.engine import Engine, Request
from backends.sim.textgen import Answer
from router.core.profile import Profile, parse_profile

Row = dict[str, Any]
BUDGET = 8192  # max_num_batched_tokens (vLLM's default on a >= 70 GiB GPU)
GRAPH_MAX = 128  # --max-cudagraph-capture-size
FEATURES = ("base", "prefill_tokens", "decode_seqs", "decode_context_tokens", "prefill_attn_mtok2")
COLS = (*FEATURES, "ovh_ttft")
DECODE_SEQS = FEATURES.index("decode_seqs")
# a row's columns: the linear step features, the TTFT constant, the eager-step counts (a step of more than
# GRAPH_MAX scheduled tokens: eager_extra = 1, eager_tokens = its tokens) and the prompt tokens the front end reads
EXT_COLS = (*COLS, "eager_extra", "eager_tokens", "ttft_per_prompt_token")
PARAMS = (*FEATURES, "ovh_ttft", "eager_floor", "eager_extra", "eager_per_token")  # the fitted model


def prefill_steps(n: int, budget: int = BUDGET) -> list[tuple[int, int]]:
    """(chunk_start, chunk_len) of each chunked-prefill step of an n-token prompt alone on the engine."""
    return [(pos, min(budget, n - pos)) for pos in range(0, n, budget)]


def row(**kw: float) -> dict[str, float]:
    return {c: float(kw.get(c, 0.0)) for c in EXT_COLS}


def step(**kw: float) -> tuple[np.ndarray, int]:
    """One engine step: its linear features (FEATURES order) and its scheduled tokens."""
    tokens = int(kw.get("prefill_tokens", 0) + kw.get("decode_seqs", 0))
    return np.array([float(kw.get(c, 0.0)) for c in FEATURES]), tokens


def model_y(r: Row, p: np.ndarray, per_token: float) -> float:
    """What the simulator's step model predicts for a row: its steps (eager ones: max(linear, floor) + extra +
    per_token x tokens), plus, for a TTFT, the front end's constant and per-prompt-token cost."""
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


def ttft_row(n: int, y_ms: float, key: str, server_prefill_ms: float | None = None) -> Row:
    chunks = prefill_steps(n)
    r = row(base=len(chunks), prefill_tokens=n, prefill_attn_mtok2=sum(c * (s + c / 2) for s, c in chunks) / 1e6,
            ovh_ttft=1, eager_extra=sum(1 for _, c in chunks if c > GRAPH_MAX),
            eager_tokens=sum(c for _, c in chunks if c > GRAPH_MAX), ttft_per_prompt_token=n)  # fmt: skip
    # client TTFT minus vLLM's own "scheduled -> first token" time: the front end + queueing outside the engine
    front = (y_ms - server_prefill_ms) / 1e3 if server_prefill_ms else None
    steps = [step(base=1, prefill_tokens=c, prefill_attn_mtok2=c * (s + c / 2) / 1e6) for s, c in chunks]
    return {"kind": "ttft", "key": key, "x": r, "y": y_ms / 1e3, "fit": True, "front": front, "n": n, "steps": steps}


def decode_row(b: int, ctx_mid: float, y_ms: float, key: str) -> Row:
    eager = b > GRAPH_MAX
    r = row(base=1, decode_seqs=b, decode_context_tokens=b * ctx_mid, eager_extra=int(eager), eager_tokens=b * eager)
    return {"kind": "eager" if eager else "decode", "key": key + (" (eager)" if eager else ""), "x": r,
            "y": y_ms / 1e3, "fit": not eager,
            "steps": [step(base=1, decode_seqs=b, decode_context_tokens=b * ctx_mid)]}  # fmt: skip


def boot_of(r: Row) -> str:
    """Which boot of the server a row was measured on: ``r<i>`` (the i-th probe file, its repeats r<i>.<k>
    together) or ``c<i>`` (the i-th co-location probe)."""
    return str(r["key"]).split(" ", 1)[0].split(".", 1)[0]


def build_rows(runs: list[dict[str, Any]]) -> list[Row]:
    """Feature rows of every measured point of one model's probes (the i-th file: boot r<i>). Also reads the
    sections earlier probes wrote: ``psweep`` (TTFT), ``dsweep`` and ``saturation.stream`` (decode)."""
    rows = []
    for i, d in enumerate(runs, 1):
        for t in [*d.get("ttft", []), *(t for t in d.get("psweep", []) if not t.get("as_ids"))]:
            if isinstance(t.get("ttft_ms"), float) and math.isfinite(t["ttft_ms"]):
                key = f"r{i} ttft p{t['prompt']}"
                rows.append(ttft_row(t["prompt"], t["ttft_ms"], key, t.get("server_prefill_ms")))
        for t in d.get("tpot", []):
            if (st := t.get("steady")) and st.get("step_ms"):
                key = f"r{i} decode b{t['batch']} p{t['prompt']}"
                rows.append(decode_row(t["batch"], st["ctx_mid"], st["step_ms"], key))
        for t in d.get("dsweep", []):
            if t.get("steady_step_ms"):
                rows.append(decode_row(t["batch"], t["steady_ctx_mid"], t["steady_step_ms"],
                                       f"r{i}.{t['rep']} decode b{t['batch']} p{t['prompt']}"))  # fmt: skip
        mix = d.get("mix") or {}
        for inj in mix.get("inject", []):
            if not inj.get("max_gap_ms"):
                continue
            b, n = mix["batch"], inj["prompt"]
            c = min(n, BUDGET - b)
            eager = c + b > GRAPH_MAX
            feats = {"base": 1, "prefill_tokens": c, "prefill_attn_mtok2": c * c / 2 / 1e6, "decode_seqs": b,
                     "decode_context_tokens": b * inj["ctx_at_gap"]}  # fmt: skip
            rows.append({"kind": "mix", "key": f"r{i} mix b{b}+p{n}", "y": inj["max_gap_ms"] / 1e3, "fit": True,
                         "x": row(**feats, eager_extra=int(eager), eager_tokens=(c + b) * eager),
                         "steps": [step(**feats)]})  # fmt: skip
        sat = (d.get("saturation") or {}).get("stream") or {}
        if (st := sat.get("steady")) and st.get("step_ms"):
            rows.append(decode_row(sat["streams"], st["ctx_mid"], st["step_ms"],
                                   f"r{i} decode b{sat['streams']} p{sat['prompt']}"))  # fmt: skip
    return rows


def colocate_rows(colocate: dict[str, Any], model: str, boot: str) -> list[Row]:
    """Decode rows of a co-location probe's phases in which ``model`` ran alone (its neighbours idle): the mean
    inter-token time of ``batch`` closed-loop streams, prompt P, answers of T tokens (mid-answer context P + T/2)."""
    ctx = colocate["prompt"] + colocate["tokens"] / 2
    alone = [ph for ph in colocate["phases"]
             if ph["subset"] == [model] and ph["batch"] <= GRAPH_MAX and ph.get("sampling", "greedy") == "greedy"]
    return [decode_row(ph["batch"], ctx, ph["tpot_ms"][model], f"{boot} decode b{ph['batch']} p{colocate['prompt']}")
            for ph in alone]  # fmt: skip


def front_slope(rows: list[Row]) -> float:
    """Seconds of front-end cost per prompt token: slope of (client TTFT - vLLM prefill time) over prompt length."""
    pts = [(r["n"], r["front"]) for r in rows if r.get("front") is not None]
    if len(pts) < 3:
        return 0.0
    return max(0.0, float(np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)[0]))


def fit(rows: list[Row], cols: tuple[str, ...], per_token: float = 0.0, by_boot: bool = False) -> np.ndarray:
    """Stage 1: NNLS on relative error over the rows with ``fit``. ``per_token``: a fixed ttft_per_prompt_token
    taken off the TTFT targets first; ``by_boot``: within each kind of point every boot weighs the same, however
    many points it has."""
    fr = [r for r in rows if r["fit"]]
    a = np.array([[r["x"][c] for c in cols] for r in fr])
    y = np.array([r["y"] - per_token * r["x"]["ttft_per_prompt_token"] for r in fr])
    w = 1.0 / y  # relative error
    kinds = [r["kind"] for r in fr]
    for k in set(kinds):  # the kinds balanced, so that many decode points do not outvote a few mixed ones
        idx = [i for i, kk in enumerate(kinds) if kk == k]
        boots = [boot_of(fr[i]) for i in idx]
        for i, b in zip(idx, boots, strict=True):  # squared weights of a kind sum to 1, each boot's to 1 / boots
            w[i] *= 1.0 / math.sqrt(len(set(boots)) * boots.count(b)) if by_boot else 1.0 / math.sqrt(len(idx))
    coef, _ = nnls(a * w[:, None], y * w)
    return np.asarray(coef)


def fit_eager(rows: list[Row], lin: np.ndarray, per_token: float, with_mix: bool = True) -> np.ndarray:
    """Stage 2: eager_floor, eager_extra, eager_per_token on the eager decode (and mixed) steps, the linear
    coefficients ``lin`` (FEATURES + ovh_ttft) held fixed. Returns the full PARAMS vector."""
    fr = [r for r in rows if r["kind"] == "eager" or (with_mix and r["kind"] == "mix")]

    def full(q: np.ndarray) -> np.ndarray:
        return np.array([*lin[:6], *q])

    def res(q: np.ndarray) -> np.ndarray:
        return np.array([model_y(r, full(q), per_token) / r["y"] - 1 for r in fr])

    if not fr:  # no step above the CUDA-graph limit measured: eager steps cost what graph steps do
        return full(np.zeros(3))
    sol = least_squares(res, np.array([0.01, 0.01, 0.0]), bounds=(0.0, np.inf), x_scale=np.array([1e-2, 1e-2, 1e-5]),
                        loss="soft_l1", f_scale=0.1)  # fmt: skip
    return full(sol.x)


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


def fit_frontend(prof: dict[str, Any], runs: list[dict[str, Any]]) -> float:
    """Stage 3: frontend_s.per_request from the warm-up bursts (their median makespan): 256 non-streaming requests
    of 64 + 16 tokens sent at once, which vLLM completes mostly at the pace its API server takes them in.
    per_request = (makespan - the engine's own time for the burst, simulated without a front end) / 256
    - per_prompt_token x 64."""
    bursts = [b for r in runs if (b := (r.get("warmup") or {}).get("burst256_makespan_s"))]
    if not bursts:
        return 0.0
    q = json.loads(json.dumps(prof))
    q.pop("frontend_s", None)
    engine_s = engine_makespan(parse_profile(q), 256, 64, 16)
    return max(0.0, (float(np.median(bursts)) - engine_s) / 256 - float(prof["frontend_s"]["per_prompt_token"]) * 64)


def fit_profile(a: argparse.Namespace, runs: list[dict[str, Any]], colocate: list[dict[str, Any]]) -> dict[str, Any]:
    rows = build_rows(runs)
    for i, c in enumerate(colocate, 1):
        rows += colocate_rows(c, a.model, f"c{i}")
    for r in rows:  # every point is fitted in its stage (the mixed steps unless --no-mix)
        r["fit"] = not (a.no_mix and r["kind"] == "mix")
    k = front_slope(rows)
    lin = fit([dict(r, fit=r["kind"] in ("ttft", "decode")) for r in rows], COLS, per_token=k,
              by_boot=a.weight == "boot")  # fmt: skip
    coef = fit_eager(rows, lin, k, with_mix=not a.no_mix)
    c = dict(zip(PARAMS, coef, strict=True))
    errs = [(model_y(r, coef, k) - r["y"]) / r["y"] for r in rows]
    print(f"== {a.model}\n  " + "  ".join(f"{n}={v:.4g}" for n, v in c.items()) + f"  fe_per_token={k:.4g}")
    for r, e in zip(rows, errs, strict=True):
        print(f"  {r['key']:30s} {r['y'] * 1e3:11.2f} ms  fit {model_y(r, coef, k) * 1e3:9.2f} ms  {e:+7.1%}"
              + ("" if r["fit"] else "  (not fitted)"))  # fmt: skip
    print(f"  mean |err| {np.mean(np.abs(errs)):.1%}, max {np.max(np.abs(errs)):.1%} over {len(rows)} points")
    cache = runs[0].get("meta", {}).get("cache_config") or {}
    kv = a.kv_tokens or int(cache.get("num_gpu_blocks", 0)) * int(cache.get("block_size", 16))
    if not kv:
        raise SystemExit("fit_profile: the probe does not know the KV budget (vllm:cache_config_info): --kv-tokens")

    def g(v: float) -> float:  # 4 significant digits
        return float(f"{v:.4g}")

    sim_http = a.sim_http_ms / 1e3
    prof: dict[str, Any] = {
        "name": a.name or f"{Path(a.out).stem if a.out else a.model}", "model": a.model, "quality": a.quality,
        "kv_budget_tokens": kv, "block_size": int(cache.get("block_size", 16)), "max_num_seqs": a.max_num_seqs,
        "max_num_batched_tokens": BUDGET, "max_model_len": a.max_model_len,
        "step_time_s": {f: g(c[f]) for f in FEATURES},
        "cudagraph": {"max_tokens": GRAPH_MAX, "eager_floor_s": g(c["eager_floor"]),
                      "eager_extra_s": g(c["eager_extra"]), "eager_per_token_s": g(c["eager_per_token"]),
                      "eager_extra_decode_only": True},
        "frontend_s": {"per_request": 0.0, "per_prompt_token": g(k)},
        "overhead_s": {"ttft": g(max(0.0, c["ovh_ttft"] - sim_http))},
        # vLLM 0.26's default: a request reaching a busy engine waits one step (the lone-request points fitted
        # above do not show it)
        "async_scheduling": True,
    }  # fmt: skip
    fe = fit_frontend(prof, runs)
    prof["frontend_s"]["per_request"] = g(fe)
    prof["overhead_s"]["ttft"] = g(max(0.0, c["ovh_ttft"] - sim_http - fe))
    prof["overhead_s"]["sim_http"] = sim_http  # wall time: the sim adds back what a speedup < 1 shrinks of it
    print(f"  frontend_s.per_request {fe * 1e3:.2f} ms, per_prompt_token {k * 1e6:.2f} us; "
          f"overhead_s.ttft {prof['overhead_s']['ttft'] * 1e3:.2f} ms")  # fmt: skip
    prof["provenance"] = {
        "status": "measured", "date": str(runs[0].get("meta", {}).get("started", ""))[:10],
        "urls": sorted({str(r.get("meta", {}).get("url")) for r in runs}), "notes": a.note,
        "script": "scripts/calibrate/probe.py; fit: scripts/calibrate/fit_profile.py",
        "sources": [*a.probes, *a.colocate], "weight": a.weight, "mixed_steps_fitted": not a.no_mix,
        "fit": {"client_ttft_constant_fitted_s": g(c["ovh_ttft"]), "sim_http_overhead_subtracted_s": sim_http,
                "boots": sorted({boot_of(r) for r in rows}), "points": len(rows),
                "mean_abs_rel_err": round(float(np.mean(np.abs(errs))), 4),
                "max_abs_rel_err": round(float(np.max(np.abs(errs))), 4)},
        "rows": {"columns": ["point", "measured_ms", "fit_ms", "rel_err", "in_fit"],
                 "rows": [[r["key"], round(r["y"] * 1e3, 3), round(model_y(r, coef, k) * 1e3, 3), round(e, 4), r["fit"]]
                          for r, e in zip(rows, errs, strict=True)]},
    }  # fmt: skip
    parse_profile(prof, source=a.out or "<fit>")  # a profile the simulator loads
    return prof


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probes", nargs="+", help="probe.py results of the model, one per boot of its server")
    ap.add_argument("--model", required=True, help="the served model name (as the probes and the config name it)")
    ap.add_argument("--out", help="where to write the profile (JSON)")
    ap.add_argument("--dry-run", action="store_true", help="print the fit only")
    ap.add_argument("--name", help="the profile's name (default: --out's stem)")
    ap.add_argument("--colocate", nargs="*", default=[],
                    help="co-location probes: the decode phases this model ran alone are fitted too")  # fmt: skip
    ap.add_argument("--quality", type=float, default=0.5, help="the model's answer quality, 0..1 (the sim's verdicts)")
    ap.add_argument("--kv-tokens", type=int, default=0, help="KV budget (default: from the first probe's server)")
    ap.add_argument("--max-num-seqs", type=int, default=1024, help="the server's (vLLM's default 1024)")
    ap.add_argument("--max-model-len", type=int, default=16384, help="the server's")
    ap.add_argument("--weight", choices=("boot", "point"), default="boot",
                    help="stage 1: each boot weighs the same in a kind of point (default), or each point")  # fmt: skip
    ap.add_argument("--no-mix", action="store_true", help="leave the mixed prefill+decode steps out of the fit")
    ap.add_argument("--sim-http-ms", type=float, default=3.0,
                    help="the simulated worker's own HTTP/SSE cost per first token, taken off the fitted client-side "
                    "TTFT constant so that it is not counted twice")  # fmt: skip
    ap.add_argument("--note", default="", help="provenance: the GPU, vLLM version, server flags, ...")
    a = ap.parse_args(argv)
    if not a.out and not a.dry_run:
        ap.error("give --out FILE or --dry-run")
    runs = [json.loads(Path(f).read_text()) for f in a.probes]
    prof = fit_profile(a, runs, [json.loads(Path(f).read_text()) for f in a.colocate])
    if a.out and not a.dry_run:
        Path(a.out).write_text(json.dumps(prof, indent=1) + "\n")
        print(f"  wrote {a.out}")


if __name__ == "__main__":
    main()
