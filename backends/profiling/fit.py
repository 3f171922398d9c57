"""Fit one model's step-time profile from probe results (:mod:`backends.profiling.probe`, one per boot of the server).

Every measured point is mapped onto the engine steps vLLM ran for it:

* TTFT of one prompt of n tokens (batch 1): ceil(n / budget) prefill chunks (``budget``: max_num_batched_tokens),
  plus the front end (a constant and ``frontend_s.per_prompt_token`` x n);
* steady decode at batch b: one step with decode_seqs = b and decode_context_tokens = b x (prompt + generated);
* a prompt injected into a decoding batch (the ``mix`` phase): the decoders' largest inter-token gap is one mixed
  step, prefill chunk min(L, budget - b) + b decoding sequences.

A step of more tokens than vLLM's CUDA graphs hold (``--max-cudagraph-capture-size``) runs eagerly and lasts
max(linear, cudagraph.eager_floor_s) + eager_extra_s + eager_per_token_s x tokens (a step that decodes nothing
pays no eager_extra_s: ``eager_extra_decode_only``, as the simulator's engine prices it). Four stages, on relative
error, the kinds of point balanced and within a kind each boot of the server weighing the same (:func:`weights`):
1. the linear step model and the TTFT constant by NNLS on the TTFT and in-graph decode points, the front end's
per-token cost (client TTFT minus vLLM's request_prefill_time, over prompt length) taken off first; 2. the eager
terms on the eager decode and mixed steps, the linear part fixed; 3. every term at once by least squares on every
point with the forward model itself (:func:`model_y`), from stages 1-2 (``Settings.staged``: skipped); 4.
``frontend_s.per_request`` from the warm-up's burst (:mod:`backends.profiling.replay`). Co-location probes add the
decode points of the phases in which this model ran alone. Probes of earlier layouts (sections ``psweep``,
``dsweep``, ``saturation``) are read too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares, nnls

from backends.profiling.replay import frontend_per_request
from router.core.errors import ConfigError, ProfileError
from router.core.profile import STEP_FEATURES, Profile, parse_profile

Row = dict[str, Any]
Array = np.ndarray[Any, np.dtype[np.float64]]
FEATURES = STEP_FEATURES
COLS = (*FEATURES, "ovh_ttft")
DECODE_SEQS = FEATURES.index("decode_seqs")
# a row's columns: the linear step features, the TTFT constant, the eager-step counts (a step of more than
# graph_max scheduled tokens: eager_extra = 1, eager_tokens = its tokens) and the prompt tokens the front end reads
EXT_COLS = (*COLS, "eager_extra", "eager_tokens", "ttft_per_prompt_token")
PARAMS = (*FEATURES, "ovh_ttft", "eager_floor", "eager_extra", "eager_per_token")  # the fitted model


@dataclass(frozen=True)
class Settings:
    """What the probes cannot tell: the server's scheduler settings, the model's quality, the profile's name."""

    model: str
    name: str
    quality: float = 0.5
    kv_tokens: int | None = None  # None: from the first probe's server (num_gpu_blocks x block_size)
    max_model_len: int | None = None  # None: the first probe's server's
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    graph_max: int = 128  # vLLM's --max-cudagraph-capture-size
    async_scheduling: bool = True
    sim_http_s: float = 0.003  # the sim's own HTTP cost per first token, kept out of overhead_s.ttft
    staged: bool = False  # without the joint stage 3 (how the shipped profiles were fitted)


def prefill_steps(n: int, budget: int) -> list[tuple[int, int]]:
    """(chunk_start, chunk_len) of each chunked-prefill step of an n-token prompt alone on the engine."""
    return [(pos, min(budget, n - pos)) for pos in range(0, n, budget)]


def _cols(**kw: float) -> dict[str, float]:
    return {c: float(kw.get(c, 0.0)) for c in EXT_COLS}


def _step(**kw: float) -> tuple[Array, int]:
    """One engine step: its linear features (FEATURES order) and its scheduled tokens."""
    tokens = int(kw.get("prefill_tokens", 0) + kw.get("decode_seqs", 0))
    return np.array([float(kw.get(c, 0.0)) for c in FEATURES]), tokens


def model_y(r: Row, p: Array, per_token: float, graph_max: int, decode_only: bool = True) -> float:
    """What the step model ``p`` (PARAMS) predicts for a row: its steps (eager ones: max(linear, floor) + extra +
    per_token x tokens; with ``decode_only`` a step that decodes nothing pays no extra), plus, for a TTFT, the
    front end's constant and per-prompt-token cost."""
    lin_c, ovh, floor, extra, ptok = p[:5], p[5], p[6], p[7], p[8]
    y = 0.0
    for x, tokens in r["steps"]:
        d = float(lin_c @ x)
        if graph_max and tokens > graph_max:
            d = max(d, floor) + (extra if x[DECODE_SEQS] > 0 or not decode_only else 0.0) + ptok * tokens
        y += d
    if r["kind"] == "ttft":
        y += ovh + per_token * r["n"]
    return y


def ttft_row(n: int, y_ms: float, key: str, budget: int, graph_max: int, server_prefill_ms: float | None = None) -> Row:
    chunks = prefill_steps(n, budget)
    x = _cols(base=len(chunks), prefill_tokens=n, prefill_attn_mtok2=sum(c * (s + c / 2) for s, c in chunks) / 1e6,
              ovh_ttft=1, eager_extra=sum(1 for _, c in chunks if c > graph_max),
              eager_tokens=sum(c for _, c in chunks if c > graph_max), ttft_per_prompt_token=n)  # fmt: skip
    # client TTFT minus vLLM's own "scheduled -> first token" time: the front end + queueing outside the engine
    front = (y_ms - server_prefill_ms) / 1e3 if server_prefill_ms else None
    steps = [_step(base=1, prefill_tokens=c, prefill_attn_mtok2=c * (s + c / 2) / 1e6) for s, c in chunks]
    return {"kind": "ttft", "key": key, "x": x, "y": y_ms / 1e3, "fit": True, "front": front, "n": n, "steps": steps}


def decode_row(b: int, ctx_mid: float, y_ms: float, key: str, graph_max: int) -> Row:
    eager = b > graph_max
    x = _cols(base=1, decode_seqs=b, decode_context_tokens=b * ctx_mid, eager_extra=int(eager), eager_tokens=b * eager)
    return {"kind": "eager" if eager else "decode", "key": key + (" (eager)" if eager else ""), "x": x,
            "y": y_ms / 1e3, "fit": True,
            "steps": [_step(base=1, decode_seqs=b, decode_context_tokens=b * ctx_mid)]}  # fmt: skip


def mix_row(b: int, n: int, ctx: float, y_ms: float, key: str, budget: int, graph_max: int) -> Row:
    c = min(n, budget - b)
    eager = c + b > graph_max
    feats = {"base": 1, "prefill_tokens": c, "prefill_attn_mtok2": c * c / 2 / 1e6, "decode_seqs": b,
             "decode_context_tokens": b * ctx}  # fmt: skip
    return {"kind": "mix", "key": key, "y": y_ms / 1e3, "fit": True, "steps": [_step(**feats)],
            "x": _cols(**feats, eager_extra=int(eager), eager_tokens=(c + b) * eager)}  # fmt: skip


def boot_of(r: Row) -> str:
    """Which boot of the server a row was measured on: ``r<i>`` (the i-th probe file, its repeats r<i>.<k>
    together) or ``c<i>`` (the i-th co-location probe)."""
    return str(r["key"]).split(" ", 1)[0].split(".", 1)[0]


def build_rows(runs: list[dict[str, Any]], budget: int, graph_max: int) -> list[Row]:
    """Feature rows of every measured point of one model's probes (the i-th probe: boot r<i>)."""
    rows = []
    for i, d in enumerate(runs, 1):
        for t in [*d.get("ttft", []), *(t for t in d.get("psweep", []) if not t.get("as_ids"))]:
            if isinstance(t.get("ttft_ms"), float) and math.isfinite(t["ttft_ms"]):
                rows.append(ttft_row(t["prompt"], t["ttft_ms"], f"r{i} ttft p{t['prompt']}", budget, graph_max,
                                     t.get("server_prefill_ms")))  # fmt: skip
        for t in d.get("tpot", []):
            if (st := t.get("steady")) and st.get("step_ms"):
                key = f"r{i} decode b{t['batch']} p{t['prompt']}"
                rows.append(decode_row(t["batch"], st["ctx_mid"], st["step_ms"], key, graph_max))
        for t in d.get("dsweep", []):
            if t.get("steady_step_ms"):
                rows.append(decode_row(t["batch"], t["steady_ctx_mid"], t["steady_step_ms"],
                                       f"r{i}.{t['rep']} decode b{t['batch']} p{t['prompt']}", graph_max))  # fmt: skip
        mix = d.get("mix") or {}
        for inj in mix.get("inject", []):
            if inj.get("max_gap_ms"):
                rows.append(mix_row(mix["batch"], inj["prompt"], inj["ctx_at_gap"], inj["max_gap_ms"],
                                    f"r{i} mix b{mix['batch']}+p{inj['prompt']}", budget, graph_max))  # fmt: skip
        sat = (d.get("saturation") or {}).get("stream") or {}
        if (st := sat.get("steady")) and st.get("step_ms"):
            rows.append(decode_row(sat["streams"], st["ctx_mid"], st["step_ms"],
                                   f"r{i} decode b{sat['streams']} p{sat['prompt']}", graph_max))  # fmt: skip
    return rows


def colocate_rows(colocate: dict[str, Any], model: str, boot: str, graph_max: int) -> list[Row]:
    """Decode rows of a co-location probe's phases in which ``model`` ran alone (its neighbours idle): the mean
    inter-token time of ``batch`` closed-loop streams, prompt P, answers of T tokens (mid-answer context P + T/2)."""
    ctx = colocate["prompt"] + colocate["tokens"] / 2
    alone = [ph for ph in colocate["phases"] if ph["subset"] == [model] and ph["batch"] <= graph_max
             and ph.get("sampling", "greedy") == "greedy"]  # fmt: skip
    return [decode_row(ph["batch"], ctx, ph["tpot_ms"][model], f"{boot} decode b{ph['batch']} p{colocate['prompt']}",
                       graph_max) for ph in alone]  # fmt: skip


def front_slope(rows: list[Row]) -> float:
    """Seconds of front-end cost per prompt token: slope of (client TTFT - vLLM prefill time) over prompt length."""
    pts = [(r["n"], r["front"]) for r in rows if r.get("front") is not None]
    if len(pts) < 3:
        return 0.0
    return max(0.0, float(np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)[0]))


def weights(rows: list[Row], by_boot: bool = True) -> Array:
    """Each row's weight in the fits, on top of relative error: the kinds of point balanced, so that many decode
    points do not outvote a few mixed ones (a kind's squared weights sum to 1), and with ``by_boot`` every boot
    of the server weighing the same within a kind, however many points it has (else every point does)."""
    w = np.ones(len(rows))
    kinds = [r["kind"] for r in rows]
    for k in set(kinds):
        idx = [i for i, kk in enumerate(kinds) if kk == k]
        boots = [boot_of(rows[i]) for i in idx]
        for i, b in zip(idx, boots, strict=True):
            w[i] = 1.0 / math.sqrt(len(set(boots)) * boots.count(b)) if by_boot else 1.0 / math.sqrt(len(idx))
    return w


def fit(rows: list[Row], cols: tuple[str, ...], per_token: float = 0.0, by_boot: bool = True) -> Array:
    """Stage 1: NNLS on relative error over the rows with ``fit`` (:func:`weights`). ``per_token``: a fixed
    ttft_per_prompt_token taken off the TTFT targets first."""
    fr = [r for r in rows if r["fit"]]
    a = np.array([[r["x"][c] for c in cols] for r in fr])
    y = np.array([r["y"] - per_token * r["x"]["ttft_per_prompt_token"] for r in fr])
    w = weights(fr, by_boot) / y  # relative error
    coef, _ = nnls(a * w[:, None], y * w)
    return np.asarray(coef, dtype=np.float64)


def fit_eager(rows: list[Row], lin: Array, per_token: float, graph_max: int) -> Array:
    """Stage 2: eager_floor, eager_extra, eager_per_token on the eager decode and mixed steps, the linear
    coefficients ``lin`` (FEATURES + ovh_ttft) held fixed. Returns the full PARAMS vector."""
    fr = [r for r in rows if r["kind"] in ("eager", "mix")]

    def full(q: Array) -> Array:
        return np.array([*lin[:6], *q])

    def res(q: Array) -> Array:
        return np.array([model_y(r, full(q), per_token, graph_max) / r["y"] - 1 for r in fr])

    if not fr:  # no step above the CUDA-graph limit measured: eager steps cost what graph steps do
        return full(np.zeros(3))
    sol = least_squares(res, np.array([0.01, 0.01, 0.0]), bounds=(0.0, np.inf), x_scale=np.array([1e-2, 1e-2, 1e-5]),
                        loss="soft_l1", f_scale=0.1)  # fmt: skip
    return full(np.asarray(sol.x, dtype=np.float64))


#: the fitted terms' typical sizes (PARAMS order): the joint stage's steps are scaled by them
TYPICAL = np.array([1e-3, 1e-6, 1e-6, 1e-9, 1e-5, 1e-2, 1e-2, 1e-2, 1e-7])


def fit_joint(rows: list[Row], p0: Array, per_token: float, graph_max: int) -> Array:
    """Stage 3: every term of PARAMS at once, from the staged solution ``p0``, on every row (:func:`weights`) with
    the forward model itself (:func:`model_y`, the simulator's step time): a lone prompt's eager chunk runs at the
    floor without the decode-only extra, so the prompts of a few hundred to a few thousand tokens set the floor and
    the eager decode and mixed steps the extra. Cauchy loss: a point the model cannot meet (on the H200, a long
    prompt injected into a decoding batch, whose decoders' gap is half what one chunk of it would take) is let go
    rather than dragging the prefill terms."""
    w = weights(rows)
    w *= math.sqrt(len(rows) / float(np.sum(w * w)))  # a typical point weighs 1: f_scale is a relative error

    def res(p: Array) -> Array:
        return np.array([model_y(r, p, per_token, graph_max) / r["y"] - 1 for r in rows]) * w

    sol = least_squares(res, np.maximum(p0, 0.0), bounds=(0.0, np.inf), x_scale=np.maximum(np.abs(p0), TYPICAL),
                        loss="cauchy", f_scale=0.1)  # fmt: skip
    return np.asarray(sol.x, dtype=np.float64)


def _g(v: float) -> float:  # 4 significant digits
    return float(f"{v:.4g}")


def fit_profile(runs: list[dict[str, Any]], colocate: list[dict[str, Any]], s: Settings) -> dict[str, Any]:
    """The profile (JSON object) of ``s.model`` fitted on ``runs`` (probe results, one per boot) and ``colocate``
    (co-location probes); ``provenance.fit`` holds the fit's errors, ``raw.fit_rows`` every point's."""
    b, gm = s.max_num_batched_tokens, s.graph_max
    rows = build_rows(runs, b, gm)
    for i, c in enumerate(colocate, 1):
        rows += colocate_rows(c, s.model, f"c{i}", gm)
    if not any(r["kind"] == "ttft" for r in rows) or not any(r["kind"] == "decode" for r in rows):
        raise ProfileError("the probes hold no TTFT or no decode point to fit (the phases ttft and tpot)")
    k = front_slope(rows)
    lin = fit([dict(r, fit=r["kind"] in ("ttft", "decode")) for r in rows], COLS, per_token=k)
    coef = fit_eager(rows, lin, k, gm)
    if not s.staged:
        coef = fit_joint(rows, coef, k, gm)
    c = dict(zip(PARAMS, coef, strict=True))
    meta = runs[0].get("meta", {}) if runs else {}
    cache = meta.get("cache_config") or {}
    kv = s.kv_tokens or meta.get("kv_tokens") or int(cache.get("num_gpu_blocks", 0)) * int(cache.get("block_size", 16))
    if not kv:
        raise ConfigError("the probed worker's metrics do not say its KV capacity (vllm:cache_config_info): give it",
                          key="--kv-tokens")  # fmt: skip
    prof: dict[str, Any] = {
        "name": s.name, "model": s.model, "quality": s.quality,
        "kv_budget_tokens": int(kv), "block_size": int(cache.get("block_size", 16)), "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": b, "max_model_len": int(s.max_model_len or meta.get("max_model_len") or 16384),
        "step_time_s": {f: _g(c[f]) for f in FEATURES},
        "cudagraph": {"max_tokens": gm, "eager_floor_s": _g(c["eager_floor"]), "eager_extra_s": _g(c["eager_extra"]),
                      "eager_per_token_s": _g(c["eager_per_token"]), "eager_extra_decode_only": True},
        "frontend_s": {"per_request": 0.0, "per_prompt_token": _g(k)},
        "overhead_s": {"ttft": _g(max(0.0, c["ovh_ttft"] - s.sim_http_s))},
        "async_scheduling": s.async_scheduling,
    }  # fmt: skip
    fe, const, warnings = frontend_per_request(prof, _bursts(runs)), max(0.0, c["ovh_ttft"] - s.sim_http_s), []
    if fe > const:  # a lone request pays the intake too: a burst cannot say more (a client too slow to burst)
        warnings.append(f"the burst says {fe * 1e3:.2f} ms of intake per request, more than a lone request's whole "
                        f"constant ({const * 1e3:.2f} ms): frontend_s.per_request capped there")  # fmt: skip
        fe = const
    prof["frontend_s"]["per_request"] = _g(fe)
    prof["overhead_s"]["ttft"] = _g(max(0.0, const - fe))
    prof["overhead_s"]["sim_http"] = s.sim_http_s  # wall time: the sim adds back what a speedup < 1 shrinks of it
    errs = [(model_y(r, coef, k, gm) - r["y"]) / r["y"] for r in rows]
    summary = _fit_summary(rows, errs, c, k, s.sim_http_s) | {"stages": "1, 2, 4" if s.staged else "1-4"}
    summary |= {"warnings": warnings} if warnings else {}
    prof["provenance"] = {"status": "measured", "date": str(meta.get("started", ""))[:10], "fit": summary}
    table = [[r["key"], round(r["y"] * 1e3, 3), round(model_y(r, coef, k, gm) * 1e3, 3), round(e, 4), r["fit"]]
             for r, e in zip(rows, errs, strict=True)]  # fmt: skip
    prof["raw"] = {"fit_rows": {"columns": ["point", "measured_ms", "fit_ms", "rel_err", "in_fit"], "rows": table}}
    parse_profile(prof, source=s.name)  # a profile the simulator loads
    return prof


def _bursts(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each probe's warm-up burst, {requests, prompt, out, makespan_s} (older probes: 256 requests of 64 + 16)."""
    out = []
    for r in runs:
        w = r.get("warmup") or {}
        if w.get("burst") and not w["burst"].get("errors"):
            out.append(w["burst"])
        elif w.get("burst256_makespan_s"):
            out.append({"requests": 256, "prompt": 64, "out": 16, "makespan_s": w["burst256_makespan_s"]})
    return out


def _fit_summary(rows: list[Row], errs: list[float], c: dict[str, float], k: float, sim_http: float) -> dict[str, Any]:
    by_kind = {}
    for kind in sorted({r["kind"] for r in rows}):
        e = [abs(x) for r, x in zip(rows, errs, strict=True) if r["kind"] == kind]
        by_kind[kind] = {"n": len(e), "mean_abs_rel_err": round(float(np.mean(e)), 4),
                         "max_abs_rel_err": round(float(np.max(e)), 4)}  # fmt: skip
    return {"client_ttft_constant_fitted_s": _g(c["ovh_ttft"]), "sim_http_overhead_subtracted_s": sim_http,
            "frontend_per_prompt_token_s": _g(k), "boots": sorted({boot_of(r) for r in rows}), "points": len(rows),
            "mean_abs_rel_err": round(float(np.mean(np.abs(errs))), 4),
            "max_abs_rel_err": round(float(np.max(np.abs(errs))), 4), "by_kind": by_kind}  # fmt: skip


# -- a profile's predictions over the probed points ------------------------------------------------------------
def params_of(profile: Profile) -> tuple[Array, float]:
    """A profile as the fit's parameters (PARAMS) and its front end's per-prompt-token cost: the TTFT constant is
    what a client measures, ``overhead_s.ttft`` + ``sim_http`` + ``frontend_s.per_request``."""
    st, cg, fe = profile.step_time, profile.cudagraph, profile.frontend
    ovh = profile.ttft_overhead_s + profile.sim_http_s + (fe.per_request if fe else 0.0)
    eager = (cg.eager_floor_s, cg.eager_extra_s, cg.eager_per_token_s) if cg else (0.0, 0.0, 0.0)
    return np.array([*(getattr(st, f) for f in FEATURES), ovh, *eager]), fe.per_prompt_token if fe else 0.0


def predict(profile: Profile, rows: list[Row]) -> list[float]:
    """Seconds ``profile`` predicts for each row (a lone prompt's TTFT, a decode step, a mixed step)."""
    p, k = params_of(profile)
    cg = profile.cudagraph
    gm, decode_only = (cg.max_tokens, cg.eager_extra_decode_only) if cg else (0, True)
    return [model_y(r, p, k, gm, decode_only) for r in rows]
