"""The analytic cold-start prior: latency from a worker's hardware profile and its live load.

Before any training the predictor still routes sensibly: a request's TTFT is the API server's constant
and its serial intake (``Frontend``: per request and per prompt token) plus the engine steps needed to
prefill the prompts queued ahead of it and its own uncached prompt, each step costing the profile's
linear step time at the current batch — or, for a step of more tokens than vLLM's CUDA graphs hold
(``CudaGraph``: a prompt over 128 tokens), the eager step's cost; on a busy worker, plus the wait
for the step in progress (half a step; one more under vLLM's async scheduling, which plans the next
step while one runs) and the API server's streaming work (``Frontend``: ``stream_wait * rho / (1 - rho)``,
the running requests taken as streamed); its TPOT is one decode step at the batch it joins; e2e adds
``(output - 1) x TPOT``. Output length before training is the simulator's default answer length
(lognormal, median 150, sigma 0.8). p90s are p50s times fixed factors. The learned models take these
estimates as features and correct them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from functools import lru_cache

from router.core.config import Config
from router.core.errors import ProfileError
from router.core.profile import (
    CudaGraph,
    Frontend,
    Profile,
    available_profiles,
    eager_step,
    load_profile,
    stream_delay,
)
from router.core.types import BackendView

DEFAULT_PROFILE = "h200-qwen2.5-7b"  # the guess for a worker whose model has no shipped profile
PRIOR_OUTPUT_P50 = 150.0
PRIOR_OUTPUT_P90 = 420.0  # 150 · exp(1.2816 · 0.8)
TTFT_P90_FACTOR = 1.6
TPOT_P90_FACTOR = 1.25
KV_PRESSURE_FROM = 0.9  # above this KV use, queueing and preemptions grow fast


@dataclass(frozen=True, slots=True)
class WorkerProfile:
    """A worker's step-time model in wall seconds (profile seconds x ``time_scale``)."""

    name: str
    time_scale: float
    base: float
    prefill: float
    decode_seqs: float
    decode_ctx: float
    attn: float
    ttft_overhead: float
    max_num_seqs: int
    max_num_batched_tokens: int
    quality: float
    #: steps a request reaching a busy engine waits before the one that schedules it: 0.5 (the rest of the
    #: step in progress), 1.5 under vLLM's async scheduling (that step's successor is already planned)
    busy_wait_steps: float = 0.5
    stream_token: float = 0.0  # the API server's work per streamed token (Frontend.stream_token)
    stream_wait: float = 0.0  # its queueing scale (Frontend.stream_wait)
    intake: float = 0.0  # the API server's serial work per request (Frontend.per_request) ...
    intake_token: float = 0.0  # ... and per prompt token (Frontend.per_prompt_token)
    graph_max: int = 0  # a step of more tokens runs without CUDA graphs (CudaGraph.max_tokens; 0: no limit)
    eager_floor: float = 0.0  # such a step: max(linear, eager_floor) + eager_extra + eager_token x tokens (eager_step)
    eager_extra: float = 0.0
    eager_token: float = 0.0
    prefill_extra: float = 0.0  # the eager_extra of a step that only prefills (CudaGraph.extra)
    gpu_share: float = 1.0  # the GPU work's share of a step (Profile.gpu_share): what a co-located neighbour waits

    @classmethod
    def of(cls, profile: Profile, time_scale: float = 1.0) -> WorkerProfile:
        """``ttft_overhead`` includes the fit's ``sim_http`` (the HTTP share of the measured constant that a sim
        adds back at run time, :attr:`Profile.sim_http_s`): a client of either measures both."""
        st, k = profile.step_time, time_scale
        fe, cg = profile.frontend or Frontend(), profile.cudagraph or CudaGraph(max_tokens=0)
        stream = fe.stream_token > 0 and fe.stream_wait > 0
        return cls(
            profile.name, k, st.base * k, st.prefill_tokens * k, st.decode_seqs * k,
            st.decode_context_tokens * k, st.prefill_attn_mtok2 * k, (profile.ttft_overhead_s + profile.sim_http_s) * k,
            profile.max_num_seqs, profile.max_num_batched_tokens, profile.quality,
            1.5 if profile.async_scheduling else 0.5,
            fe.stream_token * k if stream else 0.0, fe.stream_wait * k if stream else 0.0,
            fe.per_request * k, fe.per_prompt_token * k,
            cg.max_tokens, cg.eager_floor_s * k, cg.eager_extra_s * k, cg.eager_per_token_s * k,
            cg.extra(decoding=False) * k, profile.gpu_share,
        )  # fmt: skip


def profile_choice(name: str | None, model: str = "") -> tuple[str, str]:
    """The profile a worker routes with, and why: ``("<name>", "configured")`` for its own ``name``, else a guess,
    ``("h200-<model>", "model")`` where one is shipped for its model name, else ``(DEFAULT_PROFILE, "default")``."""
    if name is not None:
        return name, "configured"
    guess = f"h200-{model}"
    return (guess, "model") if guess in available_profiles() else (DEFAULT_PROFILE, "default")


@lru_cache(maxsize=64)
def profile_for(name: str | None, model: str = "", time_scale: float = 1.0) -> WorkerProfile:
    """``name`` (a shipped profile or a JSON path), else ``h200-<model>`` if shipped, else the default."""
    name, _ = profile_choice(name, model)
    try:
        return WorkerProfile.of(load_profile(name), time_scale)
    except ProfileError:
        return WorkerProfile.of(load_profile(DEFAULT_PROFILE), time_scale)


#: the WorkerProfile fields in seconds (multiplied by ``time_scale``); the rest are counts, levels and the quality
_SECONDS = frozenset({"base", "prefill", "decode_seqs", "decode_ctx", "attn", "ttft_overhead", "stream_token",
                      "stream_wait", "intake", "intake_token", "eager_floor", "eager_extra", "eager_token",
                      "prefill_extra"})  # fmt: skip


def fingerprint(wp: WorkerProfile) -> str:
    """A short digest of a worker profile's terms in profile seconds (its ``time_scale`` taken out), so one profile
    run at two speedups has one fingerprint and a refitted profile of the same name another. A learned predictor
    records the fingerprints it was trained on (``Predictor.profiles_``): its latency models take the prior as
    features, so the same name with other terms gives them other inputs than they were fitted on."""
    k = wp.time_scale or 1.0
    terms = ";".join(
        f"{f.name}={(getattr(wp, f.name) / k if f.name in _SECONDS else getattr(wp, f.name)):.6g}"
        for f in fields(wp)
        if f.name not in ("name", "time_scale", "gpu_share")  # gpu_share: no latency model reads it
    )
    return hashlib.sha256(terms.encode()).hexdigest()[:16]


def changed_profiles(trained: Mapping[str, str], profiles: Mapping[str, WorkerProfile]) -> list[str]:
    """The names of ``profiles`` that a predictor trained on ``trained`` (name -> fingerprint) knew by other terms."""
    return sorted({wp.name for wp in profiles.values() if wp.name in trained and trained[wp.name] != fingerprint(wp)})


def worker_profiles(config: Config) -> dict[str, WorkerProfile]:
    """Every configured backend's profile, by backend name, with the backend's own ``quality`` where it sets one."""
    out = {}
    for b in config.backends:
        wp = profile_for(b.profile_name, b.model, b.time_scale)
        out[b.name] = wp if b.quality is None else replace(wp, quality=b.quality)
    return out


def worker_load(view: BackendView) -> int:
    """Requests on the worker: the scrape's running + waiting, or this gateway's in-flight requests when
    more (the scrape may lag its own dispatches) — the load :func:`prior_latency` queues behind, and
    the calibration's load buckets (:mod:`predictor.calibration`)."""
    return max((view.running or 0) + (view.waiting or 0), view.inflight_requests)


def prior_latency(wp: WorkerProfile, view: BackendView, prompt_tokens: int, cached: float) -> tuple[float, float]:
    """(TTFT p50, TPOT p50) in seconds of a request of ``prompt_tokens`` (``cached`` share already in
    the worker's prefix cache) sent to a worker in the state ``view``."""
    # the hot path (once per candidate worker and decision): plain locals and conditionals
    n = (view.running or 0) + (view.waiting or 0)  # worker_load, inline
    inflight = view.inflight_requests
    if inflight > n:
        n = inflight
    n_run = n if n < wp.max_num_seqs else wp.max_num_seqs
    per_req = view.inflight_tokens / inflight if inflight else float(prompt_tokens)
    ctx = 0.5 * per_req  # a running request is, on average, half way through its reservation
    per_seq = wp.decode_seqs + wp.decode_ctx * ctx
    decode_lin = wp.base + per_seq * n_run
    own = prompt_tokens * (1.0 - cached)
    # the prompts ahead: requests queued above max_num_seqs, and this gateway's streamed prompts still without a
    # first token; a queued streamed request is in both, so the larger of the two, not their sum
    ahead = (n - n_run) * 0.5 * per_req
    if view.pending_prefill_tokens > ahead:
        ahead = view.pending_prefill_tokens
    budget = wp.max_num_batched_tokens - n_run
    steps = math.ceil((own + ahead) / (budget if budget > 1 else 1)) or 1
    attn = wp.attn * own * (prompt_tokens - own + own / 2) / 1e6
    prefill = steps * decode_lin + wp.prefill * (own + ahead) + attn  # the prefill steps, linear model
    ttft = wp.ttft_overhead + wp.intake + wp.intake_token * prompt_tokens
    g, floor, extra, per_token = wp.graph_max, wp.eager_floor, wp.eager_extra, wp.eager_token
    first = extra if n_run else wp.prefill_extra  # an idle engine's prefill steps decode nothing
    ttft += eager_step(prefill / steps, n_run + (own + ahead) / steps, g, floor, first, per_token) * steps
    if n_run:  # a busy engine: the step in progress (and, async, the one planned), the API server's streaming
        decode_step = eager_step(decode_lin, n_run, g, floor, extra, per_token)
        ttft += wp.busy_wait_steps * decode_step
        if wp.stream_wait:  # its share of the event loop: n_run tokens a step
            ttft += stream_delay(wp.stream_wait, wp.stream_token * n_run / decode_step)
    kv = view.kv_usage or 0.0
    if kv > KV_PRESSURE_FROM:
        ttft *= 1.0 + 10.0 * (kv - KV_PRESSURE_FROM)
    tpot = eager_step(decode_lin + per_seq, n_run + 1, g, floor, extra, per_token)
    return ttft, tpot


def prior_output(max_tokens: int | None) -> tuple[float, float]:
    cap = float(max_tokens) if max_tokens else math.inf
    return min(PRIOR_OUTPUT_P50, cap), min(PRIOR_OUTPUT_P90, cap)


def profiles_by_model(profiles: Mapping[str, WorkerProfile], views: tuple[BackendView, ...]) -> list[WorkerProfile]:
    """The profile of each view: its backend's, else a guess from its model name."""
    return [profiles.get(v.name) or profile_for(None, v.model) for v in views]
