"""The worker profile format: one model on one GPU, as the predictor and the simulator read it.

A profile is a JSON file (``router/core/profiles/<name>.json``) describing one model on one GPU:
its KV budget, the scheduler knobs vLLM ran with, and a linear model of one engine step's duration
over per-step features (see :data:`STEP_FEATURES`). Profiles are measured on a live worker with
`chimera profile` (``backends/profiling/``, docs/profiling.md); this module only reads and validates them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.core.errors import ProfileError

PROFILE_DIR = Path(__file__).parent / "profiles"

#: How a served model turns prompts into token ids: ``words`` (one token per whitespace-separated word)
#: or ``wordlevel`` (the word-level vocabulary of the random-weight test models; see the simulator's
#: ``backends.sim.textgen.Tokenizer``).
TOKENIZER_KINDS = ("words", "wordlevel")


@dataclass(frozen=True)
class TokenizerSpec:
    """A profile's ``tokenizer`` section: which tokenizer kind the served model uses, and its vocabulary."""

    kind: str = "words"
    vocab_size: int = 151936


#: Features of one engine step that the step-time model is linear in.
#: base: 1 per step; prefill_tokens: tokens prefilled (sum of chunk lengths); decode_seqs: sequences
#: decoding one token; decode_context_tokens: sum of the KV lengths of those sequences;
#: prefill_attn_mtok2: sum over prefill chunks of len * (start + len / 2) / 1e6 (causal attention work).
STEP_FEATURES = ("base", "prefill_tokens", "decode_seqs", "decode_context_tokens", "prefill_attn_mtok2")


@dataclass(frozen=True)
class StepTime:
    """Seconds per unit of each step feature (real GPU time, before ``speedup``)."""

    base: float = 0.0
    prefill_tokens: float = 0.0
    decode_seqs: float = 0.0
    decode_context_tokens: float = 0.0
    prefill_attn_mtok2: float = 0.0


@dataclass(frozen=True)
class CudaGraph:
    """vLLM's CUDA-graph limit: a step scheduling more than ``max_tokens`` tokens runs without graphs.

    Such a step lasts ``max(linear model, eager_floor_s) + eager_extra_s + eager_per_token_s * tokens``:
    without graphs every kernel is launched from the CPU, so a small step is launch-bound (the floor)
    and a large one GPU-bound (the linear model); ``--max-cudagraph-capture-size`` in vLLM.
    With ``eager_extra_decode_only`` a step that only prefills (no sequence decoding in it) does not pay
    ``eager_extra_s``: on the H200 the lone prompts' TTFTs hold no such cost, the eager decode and mixed steps do
    (docs/profiling.md).
    """

    max_tokens: int
    eager_floor_s: float = 0.0
    eager_extra_s: float = 0.0
    eager_per_token_s: float = 0.0
    eager_extra_decode_only: bool = False

    def extra(self, decoding: bool) -> float:
        """The ``eager_extra_s`` an eager step pays: none for a prefill-only step when ``eager_extra_decode_only``."""
        return self.eager_extra_s if decoding or not self.eager_extra_decode_only else 0.0


@dataclass(frozen=True)
class Frontend:
    """vLLM's API server: one process that takes requests one at a time (a FIFO server).

    Each request occupies it for ``per_request + per_prompt_token * prompt_tokens`` seconds before it
    reaches the engine's queue; a burst of requests therefore reaches the engine spread out.

    The same process (one event loop) writes every streamed token to its client. At a rate of ``r`` streamed
    tokens per second its share of that work is ``rho = r * stream_token``, and a request then takes
    ``stream_wait * rho / (1 - rho)`` longer to get through it (its intake and its first token's way back,
    measured together on real vLLM: the profiles' ``provenance.stream``; ``rho`` capped at ``STREAM_RHO_MAX``).
    """

    per_request: float = 0.0
    per_prompt_token: float = 0.0
    stream_token: float = 0.0
    stream_wait: float = 0.0


#: The API server's streaming share is capped at the highest the split probes measured (0.68, the 0.5B with 64
#: streams): past it vLLM coalesces tokens into fewer chunks, and the queueing formula, unmeasured there, would grow
#: without bound. The sim's small models decode faster than the probed boots, so without the cap they would reach
#: it at 64 streams and wait ~195 ms where the H200 waited 33-98 ms (docs/profiling.md).
STREAM_RHO_MAX = 0.7


def stream_delay(stream_wait: float, rho: float) -> float:
    """How much longer a request takes through the API server that spends ``rho`` of its time streaming tokens
    (``Frontend``): ``stream_wait * rho / (1 - rho)``, ``rho`` capped at :data:`STREAM_RHO_MAX`."""
    rho = rho if rho < STREAM_RHO_MAX else STREAM_RHO_MAX
    return stream_wait * rho / (1.0 - rho)


#: NVIDIA's time-slicing of one GPU between processes (no MPS), measured on an H200 with vLLM 0.26.0: the slice a
#: context runs before the GPU goes to the next one with work, and the cost of handing it over, in seconds. Fitted
#: to the shipped profiles' own steps over the shared phases of the co-location probes
#: (``docs/results/real-h200/probes/colocate-*.json``, docs/profiling.md). The simulator's shared GPU
#: (backends/sim/gpu.py) runs on them; the predictive policy prices co-located workers with them.
GPU_TIMESLICE_S = 0.00156
GPU_SWITCH_S = 0.0006


def eager_step(linear: float, tokens: float, graph_max: int, floor: float, extra: float, per_token: float) -> float:
    """A step of ``tokens`` tokens whose linear model says ``linear`` seconds: itself within vLLM's CUDA graphs
    (``tokens <= graph_max``, or no limit: 0), else the eager step's ``max(linear, floor) + extra + per_token *
    tokens`` (``CudaGraph``)."""
    if graph_max and tokens > graph_max:
        return (linear if linear > floor else floor) + extra + per_token * tokens
    return linear


@dataclass(frozen=True)
class Sampling:
    """CPU work of vLLM's sampler beyond a greedy argmax, per step (``sampling_s`` in the JSON).

    A step pays ``random`` when any request it schedules samples at random (temperature > 0, or absent: vLLM's
    default 1.0) and ``min_tokens`` when any is still short of its ``min_tokens``. The work is the engine's CPU
    (kernel launches and Python in the sampler), which vLLM overlaps with the GPU's: the step lasts
    ``max(step, cpu + cost)``, where ``cpu`` is ``cpu_base + cpu_per_seq * requests`` for a step inside the CUDA
    graphs and the whole step otherwise (``cpu_base`` absent: a CPU-bound engine, which pays the cost in full).
    """

    random: float = 0.0
    min_tokens: float = 0.0
    cpu_base: float | None = None
    cpu_per_seq: float = 0.0


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    quality: float
    kv_budget_tokens: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    step_time: StepTime
    ttft_overhead_s: float
    provenance: dict[str, Any]
    cudagraph: CudaGraph | None = None
    frontend: Frontend | None = None
    #: The share of the linear model's step time that is GPU work (the rest is the engine's CPU work:
    #: scheduler, sampler, launches). Matters only for workers that share a GPU (backends/sim/gpu.py).
    gpu_share: float = 1.0
    #: How prompts become token ids (:class:`TokenizerSpec`): the sim's own words unless the profile
    #: names the real test models' word-level tokenizer (what the H200 comparison runs served).
    tokenizer: TokenizerSpec = TokenizerSpec()
    #: vLLM's async scheduling (on by default since ~0.20 for a plain generative model): the engine
    #: schedules step N+1 while step N runs, so a request that reaches a busy engine's queue during
    #: step N is first scheduled in step N+2 (one step later than a synchronous scheduler).
    async_scheduling: bool = False
    #: The sampler's extra CPU work for non-greedy requests (``Sampling``); None: every request costs the same.
    sampling: Sampling | None = None
    #: The simulated worker's own HTTP/SSE cost per first token (wall seconds, on the development box) that the
    #: fit took off the measured client-side TTFT constant (``overhead_s.sim_http``). Being wall time, it does
    #: not shrink with ``speedup``: at speedup x the engine adds ``(1/x - 1) * sim_http`` so that the client
    #: still sees the measured constant in modelled (H200) time.
    sim_http_s: float = 0.0
    #: How much the front end's constant varies request to request (``overhead_s.ttft_jitter``, seconds): each
    #: request's ``ttft_overhead_s`` is drawn evenly from ``ttft ± jitter / 2`` (seeded), so the median TTFT
    #: stays where the fit put it. Real vLLM's idle TTFT varies about ±4-5 ms request to request (10th-90th
    #: percentile, docs/profiling.md); 0, the default, keeps the sim deterministic.
    ttft_jitter_s: float = 0.0


def available_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str) -> Profile:
    """Load a shipped profile by name, or a profile JSON by path."""
    path = Path(name_or_path)
    if not (name_or_path.endswith(".json") or path.is_file()):
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.is_file():
        known = ", ".join(available_profiles()) or "none"
        raise ProfileError(f"unknown profile {name_or_path!r} (known: {known})")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"profile {path}: cannot read JSON: {exc}") from exc
    return parse_profile(raw, source=str(path))


def parse_profile(raw: Any, source: str = "<profile>") -> Profile:
    """Validate a decoded profile JSON object."""
    if not isinstance(raw, dict):
        raise ProfileError(f"profile {source}: expected a JSON object")
    try:
        steps = raw["step_time_s"]
        if not isinstance(steps, dict):
            raise ProfileError(f"profile {source}: step_time_s must be an object")
        unknown = sorted(set(steps) - set(STEP_FEATURES))
        if unknown:
            raise ProfileError(f"profile {source}: unknown step_time_s key(s) {', '.join(unknown)}")
        coefs = {k: _number(source, f"step_time_s.{k}", v, minimum=0.0) for k, v in steps.items()}
        overhead = _section(source, raw, "overhead_s", ("ttft", "sim_http", "ttft_jitter"))
        quality = _number(source, "quality", raw["quality"], minimum=0.0)
        if quality > 1.0:
            raise ProfileError(f"profile {source}: quality must be in [0, 1], got {quality}")
        provenance = raw.get("provenance", {})
        return Profile(
            name=str(raw.get("name", Path(source).stem)),
            model=_string(source, "model", raw["model"]),
            quality=quality,
            kv_budget_tokens=_int(source, "kv_budget_tokens", raw["kv_budget_tokens"]),
            block_size=_int(source, "block_size", raw.get("block_size", 16)),
            max_num_seqs=_int(source, "max_num_seqs", raw["max_num_seqs"]),
            max_num_batched_tokens=_int(source, "max_num_batched_tokens", raw["max_num_batched_tokens"]),
            max_model_len=_int(source, "max_model_len", raw["max_model_len"]),
            step_time=StepTime(**coefs),
            ttft_overhead_s=_number(source, "overhead_s.ttft", overhead.get("ttft", 0.0), minimum=0.0),
            provenance=provenance if isinstance(provenance, dict) else {},
            cudagraph=_cudagraph(source, raw),
            frontend=_frontend(source, raw),
            gpu_share=_share(source, raw.get("gpu_share", 1.0)),
            tokenizer=_tokenizer(source, raw),
            async_scheduling=_flag(source, "async_scheduling", raw.get("async_scheduling", False)),
            sampling=_sampling(source, raw),
            sim_http_s=_number(source, "overhead_s.sim_http", overhead.get("sim_http", 0.0), minimum=0.0),
            ttft_jitter_s=_jitter(source, overhead),
        )
    except KeyError as exc:
        raise ProfileError(f"profile {source}: missing key {exc.args[0]!r}") from exc


def _section(source: str, raw: dict[str, Any], key: str, known: tuple[str, ...]) -> dict[str, Any]:
    """An optional object of the profile; absent = {}; a key not in ``known`` is an error."""
    sec = raw.get(key, {})
    if not isinstance(sec, dict):
        raise ProfileError(f"profile {source}: {key} must be an object")
    unknown = sorted(set(sec) - set(known))
    if unknown:
        raise ProfileError(f"profile {source}: unknown {key} key(s) {', '.join(unknown)}")
    return sec


def _share(source: str, value: Any) -> float:
    share = _number(source, "gpu_share", value, minimum=0.0)
    if share > 1.0:
        raise ProfileError(f"profile {source}: gpu_share must be in [0, 1], got {share}")
    return share


def _cudagraph(source: str, raw: dict[str, Any]) -> CudaGraph | None:
    if "cudagraph" not in raw:
        return None
    sec = _section(
        source,
        raw,
        "cudagraph",
        ("max_tokens", "eager_floor_s", "eager_extra_s", "eager_per_token_s", "eager_extra_decode_only"),
    )
    decode_only = sec.get("eager_extra_decode_only", False)
    if not isinstance(decode_only, bool):
        raise ProfileError(f"profile {source}: cudagraph.eager_extra_decode_only must be true or false")
    if "max_tokens" not in sec:
        raise ProfileError(f"profile {source}: missing key 'cudagraph.max_tokens'")
    return CudaGraph(
        max_tokens=_int(source, "cudagraph.max_tokens", sec["max_tokens"]),
        eager_floor_s=_number(source, "cudagraph.eager_floor_s", sec.get("eager_floor_s", 0.0), minimum=0.0),
        eager_extra_s=_number(source, "cudagraph.eager_extra_s", sec.get("eager_extra_s", 0.0), minimum=0.0),
        eager_per_token_s=_number(
            source, "cudagraph.eager_per_token_s", sec.get("eager_per_token_s", 0.0), minimum=0.0
        ),
        eager_extra_decode_only=decode_only,
    )


def _sampling(source: str, raw: dict[str, Any]) -> Sampling | None:
    if "sampling_s" not in raw:
        return None
    sec = _section(source, raw, "sampling_s", ("random", "min_tokens", "cpu_base", "cpu_per_seq"))
    num = {k: _number(source, f"sampling_s.{k}", v, minimum=0.0) for k, v in sec.items()}
    return Sampling(
        random=num.get("random", 0.0),
        min_tokens=num.get("min_tokens", 0.0),
        cpu_base=num.get("cpu_base"),
        cpu_per_seq=num.get("cpu_per_seq", 0.0),
    )


def _flag(source: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(f"profile {source}: {key} must be true or false, got {value!r}")
    return value


def _tokenizer(source: str, raw: dict[str, Any]) -> TokenizerSpec:
    sec = _section(source, raw, "tokenizer", ("kind", "vocab_size"))
    kind = sec.get("kind", "words")
    if kind not in TOKENIZER_KINDS:
        known = ", ".join(TOKENIZER_KINDS)
        raise ProfileError(f"profile {source}: tokenizer.kind must be one of {known}, got {kind!r}")
    if "vocab_size" not in sec:
        return TokenizerSpec(kind)
    return TokenizerSpec(kind, _int(source, "tokenizer.vocab_size", sec["vocab_size"]))


def _jitter(source: str, overhead: dict[str, Any]) -> float:
    jitter = _number(source, "overhead_s.ttft_jitter", overhead.get("ttft_jitter", 0.0), minimum=0.0)
    ttft = overhead.get("ttft", 0.0)
    if jitter > 2 * ttft:  # a draw below zero would move a first token earlier than the engine allows
        raise ProfileError(f"profile {source}: overhead_s.ttft_jitter ({jitter}) must be at most twice overhead_s.ttft")
    return jitter


def _frontend(source: str, raw: dict[str, Any]) -> Frontend | None:
    if "frontend_s" not in raw:
        return None
    keys = ("per_request", "per_prompt_token", "stream_token", "stream_wait")
    sec = _section(source, raw, "frontend_s", keys)
    return Frontend(**{k: _number(source, f"frontend_s.{k}", sec.get(k, 0.0), minimum=0.0) for k in keys})


def positive_int(what: str, value: int | None) -> int | None:
    """Check an optional override; ``None`` passes through."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ProfileError(f"{what} must be a positive integer, got {value!r}", setting=what)
    return value


def _number(source: str, key: str, value: Any, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(f"profile {source}: {key} must be a number, got {value!r}")
    if value < minimum:
        raise ProfileError(f"profile {source}: {key} must be >= {minimum}, got {value}")
    return float(value)


def _int(source: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProfileError(f"profile {source}: {key} must be a positive integer, got {value!r}")
    return value


def _string(source: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ProfileError(f"profile {source}: {key} must be a non-empty string")
    return value
