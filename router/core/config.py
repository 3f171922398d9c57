"""YAML config → frozen, validated objects. Parsed once at start-up and passed explicitly.

``load_config(path)`` substitutes ``${VAR}`` from the environment, validates with pydantic and
raises :class:`router.core.errors.ConfigError` whose message names ``file:line: key``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from router.core.configbase import At as _At
from router.core.configbase import Frozen as _Frozen
from router.core.configbase import NonNegInt, PosFloat, PosInt
from router.core.errors import ConfigError
from router.core.options import AdmissionConfig as AdmissionConfig
from router.core.options import EnginePriorityConfig as EnginePriorityConfig
from router.core.options import PolicyOptions as PolicyOptions
from router.core.options import PredictorConfig as PredictorConfig
from router.core.types import Engine
from router.core.yamlload import Loc, dotted, nearest_line, read_yaml

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})

AUTO_MODEL = "auto"


class SLA(_Frozen):
    """Latency objectives of an agent; ``None`` means no objective of that kind."""

    ttft_ms: PosFloat | None = None
    """Time to first token, milliseconds (p50 objective per request)."""
    tpot_ms: PosFloat | None = None
    """Time per output token after the first, milliseconds."""
    e2e_ms: PosFloat | None = None
    """Whole request, milliseconds."""


class SimSpec(_Frozen):
    """A simulated worker that ``chimera serve`` starts at the backend's URL."""

    profile: str
    """The worker profile it simulates: a shipped name (`h200-qwen2.5-7b`) or a profile JSON file."""
    speedup: PosFloat = 1.0
    """Run this many times faster than the profile's GPU (the gateway scales its predictions to match)."""
    seed: int = 0
    """Seed of the simulated answers' lengths and verdicts."""
    kv_tokens: PosInt | None = None
    """KV cache size in tokens (default: the profile's)."""
    max_num_seqs: PosInt | None = None
    """vLLM's `--max-num-seqs` (default: the profile's)."""
    max_num_batched_tokens: PosInt | None = None
    """vLLM's `--max-num-batched-tokens` (default: the profile's)."""
    runner: Literal["generate", "pooling"] = "generate"
    """vLLM's `--runner`: a generative model (completions), or a pooling one that serves only `/v1/embeddings`."""


class LaunchSpec(_Frozen):
    """A real vLLM worker that ``chimera workers up`` starts."""

    hf_model: str
    """The Hugging Face model (or local path) vLLM serves."""
    gpu: NonNegInt = 0
    """The GPU it is pinned to (`CUDA_VISIBLE_DEVICES`)."""
    kv_cache_gib: PosFloat
    """Its fixed KV budget in GiB (vLLM's `--kv-cache-memory-bytes`)."""
    extra_args: tuple[str, ...] = ()
    """More `vllm serve` arguments, passed as they are."""


class BackendConfig(_Frozen):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    """Unique worker name (letters, digits, `_.:-`): in `/fleet`, metrics, logs and `X-Chimera-Backend`."""
    url: str
    """The worker's base URL, `http(s)://host:port` without a path."""
    model: Annotated[str, Field(min_length=1)]
    """The model name the worker serves (its `--served-model-name`)."""
    kv_budget_tokens: PosInt
    """The worker's fixed KV budget in tokens: the capacity admission control and the policies reserve against."""
    max_model_len: PosInt = 8192
    """The worker's context length; longer requests are not sent to it."""
    gpu: NonNegInt | None = None
    """The GPU the worker is pinned to on its host (default: its `launch.gpu`). Workers of one host on one GPU share
    it: the predictive policy prices the time-slicing between them, and simulated workers on one GPU share a
    modelled one."""
    tags: tuple[str, ...] = ()
    """Labels shown in `/fleet`; `length_split` sends long prompts to workers tagged `policy_options.long_tag`."""
    sim: SimSpec | None = None
    """Start a simulated vLLM worker at `url` (`chimera serve` does)."""
    launch: LaunchSpec | None = None
    """Start a real vLLM worker at `url` (`chimera workers up` does)."""
    profile: str | None = None
    """The worker profile the predictor's prior uses: a shipped name or a profile JSON file (default: the
    `sim:` profile, else a guess from the model name)."""
    quality: Annotated[float, Field(ge=0, le=1)] | None = None
    """How good its model's answers are, 0..1 (from its published benchmark scores, say; a reference: Qwen2.5-7B
    0.78, 1.5B 0.6): what the predictive policy weighs against speed (default: the profile's)."""
    engine: Engine | None = None
    """The server it runs: `vllm`, `sglang`, `tgi`, `trtllm` or `lightllm`, whose own metrics give its running and
    waiting requests and KV use (default: detected from its `/metrics`)."""
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    """What the worker runs (vLLM's `--scheduling-policy`); under `priority` the gateway sends each request's priority
    in its body, and `chimera serve` / `chimera workers up` start it that way."""
    api_key: str | None = None
    """The worker's own API key (vLLM's `--api-key`): sent as `Authorization: Bearer` on every request to it (never the
    caller's key)."""

    @field_validator("api_key")
    @classmethod
    def _empty_api_key_is_none(cls, v: str | None) -> str | None:
        return v or None  # `${WORKER_KEY:-}` left empty: no key

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {v!r}")
        try:
            parts.port  # noqa: B018  (raises on a bad port)
        except ValueError as exc:
            raise ValueError(f"bad port in URL {v!r}") from exc
        if parts.port == 0:
            raise ValueError(f"port 0 in URL {v!r}")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"URL must be scheme://host:port without a path: {v!r}")
        return v.rstrip("/")

    @property
    def profile_name(self) -> str | None:
        """The worker's hardware profile: ``profile``, else its sim's, else none (a guess by model)."""
        return self.profile or (self.sim.profile if self.sim is not None else None)

    @property
    def time_scale(self) -> float:
        """Real seconds per profile second: 1 for a real GPU, 1/speedup for a simulated worker."""
        return 1.0 / self.sim.speedup if self.sim is not None else 1.0

    @property
    def shared_gpu(self) -> str | None:
        """Which GPU the worker runs on, as ``host/gpu`` (loopback names as one host): workers with the same key
        time-share that GPU. None where neither ``gpu`` nor ``launch.gpu`` says."""
        gpu = self.gpu if self.gpu is not None else (self.launch.gpu if self.launch is not None else None)
        if gpu is None:
            return None
        host = (urlsplit(self.url).hostname or "").lower()
        return f"{'localhost' if host in LOOPBACK_HOSTS else host}/{gpu}"

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"


class AgentConfig(_Frozen):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    """Unique agent name (letters, digits, `_.:-`); callers name it with `X-Agent` where no agent has keys."""
    api_keys: tuple[Annotated[str, Field(min_length=1)], ...] = ()
    """Keys that identify this agent (`Authorization: Bearer KEY`); `${VAR}` reads one from the environment."""
    models: Annotated[tuple[str, ...], Field(min_length=1)]
    """The served models this agent may use (`model: auto`: the router chooses); the order is no preference,
    each policy chooses by its own rule (a fixed first choice would herd the agent onto one worker)."""
    sla: SLA = SLA()
    """The agent's latency objectives (a request may tighten them with `x-slo-ttft-ms`, `x-slo-tpot-ms`)."""
    priority: NonNegInt = 1
    """Lower is more urgent: ordering in admission control's queue and in priority-scheduled workers."""
    min_quality: Annotated[float, Field(ge=0, le=1)] | None = None
    """The least predicted chance of a good answer the agent accepts (predictive policy)."""
    on_overload: Literal["queue", "reject", "degrade"] = "queue"
    """When every worker is full (needs `gateway.admission`): wait in the queue, answer 429, or degrade (`max_tokens`
    capped)."""
    rpm: PosInt | None = None
    """Requests per minute the agent may send (429 beyond)."""
    tpm: PosInt | None = None
    """Tokens per minute (prompt estimate + `max_tokens`) the agent may send (429 beyond)."""


class Timeouts(_Frozen):
    """Worker-client timeouts, in seconds."""

    connect_s: PosFloat = 2.0
    """Connecting to a worker."""
    first_byte_s: PosFloat = 60.0
    """Streamed requests: until the first SSE byte (queueing and prefill)."""
    between_chunks_s: PosFloat = 30.0
    """Streamed requests: between two chunks."""
    response_s: PosFloat = 600.0
    """Non-streamed requests: the whole answer, from when it was sent, however its bytes trickle."""
    stream_s: PosFloat = 1800.0
    """Streamed requests: the whole stream, from when it was sent; past it the stream ends with an error event (a
    stream kept open a byte at a time would hold its worker's slot and its reservation for ever)."""


class HealthConfig(_Frozen):
    probe_interval_s: PosFloat = 1.0
    """How often each worker's `/health` and `/metrics` are scraped."""
    probe_timeout_s: PosFloat = 1.0
    """How long one probe may take."""
    eject_after_failures: PosInt = 3
    """Consecutive failures (probes or requests) that take a worker out of rotation."""
    readmit_after_successes: PosInt = 1
    """Consecutive good probes that bring it back."""
    eject_backoff_s: Annotated[float, Field(ge=0)] = 1.0
    """A worker that fails again before serving one request after its re-admission is kept out at least this long,
    doubling each time (outlier ejection)."""
    eject_backoff_max_s: PosFloat = 60.0
    """The longest such backoff."""


class GatewayConfig(_Frozen):
    host: str = "127.0.0.1"
    """The address `chimera serve` listens on."""
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    """Its port."""
    state: str = "memory"
    """Fleet state: `memory`, or a Redis URL shared by gateway replicas (`redis://HOST:PORT/DB`, `rediss://` for TLS,
    `unix:///path`, or `redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]` to follow Sentinel failovers)."""
    policy: str = "least_outstanding"
    """The routing policy, a name of the policy registry (`router.policies`), checked at start-up
    (docs/policies.md)."""
    policy_options: PolicyOptions = PolicyOptions()
    """The policies' knobs."""
    request_log: str | None = None
    """A JSON-lines file: one line per finished request (what `chimera predictor train` reads)."""
    max_body_bytes: PosInt = 4 * 1024 * 1024
    """Larger request bodies are answered 413."""
    max_header_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024
    """A request head (its request line and headers) larger than this is answered 431 and its connection closed,
    before anything reads it: checked as the bytes arrive, so a huge header never fills the gateway's memory."""
    max_response_bytes: Annotated[int, Field(ge=1024)] = 16 * 1024 * 1024
    """A worker's non-streamed answer larger than this is refused as a broken answer (502, or the next worker), as
    soon as its bytes pass it: what the gateway holds of one answer at most. Raise it for large embedding batches or
    answers with many logprobs. A worker's error body is read to its first 64 KiB only."""
    max_buffered_bytes: Annotated[int, Field(ge=1024)] = 32 * 1024 * 1024
    """What the gateway holds at most of all the non-streamed answers it is reading at once: an answer that would take
    it past is refused as a broken one (502, or the next worker), so that many large answers at once cannot exhaust
    the gateway's memory. At least `max_response_bytes`."""
    max_event_bytes: Annotated[int, Field(ge=1024)] = 8 * 1024 * 1024
    """A streamed answer's event (an SSE event: up to its blank line) larger than this ends the stream with an error
    event: the gateway holds one event at most."""
    default_agent: str | None = None
    """The agent of callers that name none (only where no agent has keys)."""
    max_attempts: PosInt = 3
    """Workers tried per request before the first byte (retries on connect errors, timeouts, 5xx)."""
    timeouts: Timeouts = Timeouts()
    """Worker-client timeouts."""
    health: HealthConfig = HealthConfig()
    """Probing and ejection of workers."""
    predictor: PredictorConfig | None = None
    """The learned predictor (absent: the analytic prior where the policy is `predictive`, no predictor otherwise)."""
    admission: AdmissionConfig | None = None
    """Overload handling: admission control, the priority queue, degradation (absent: every request is dispatched at
    once)."""
    engine_priority: EnginePriorityConfig = EnginePriorityConfig()
    """The `priority` sent to workers with `scheduling_policy: priority`."""
    admin_key: str | None = None
    """When set, `/fleet` and `/metrics` need `Authorization: Bearer <admin_key>`."""

    @field_validator("admin_key")
    @classmethod
    def _empty_admin_key_is_none(cls, v: str | None) -> str | None:
        return v or None  # `${ADMIN_KEY:-}` left empty: no admin key

    @field_validator("state")
    @classmethod
    def _check_state(cls, v: str) -> str:
        if v == "memory":
            return v
        parts = urlsplit(v)
        schemes = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
        if parts.scheme not in schemes or not (parts.netloc or parts.path):
            raise ValueError(f"state must be 'memory' or a redis://, rediss://, unix:// or redis+sentinel:// URL, "
                             f"not {v!r}")  # fmt: skip
        from router.core.stateurl import check_redis_url

        try:
            check_redis_url(v)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        return v

    @model_validator(mode="after")
    def _holds_one_answer(self) -> Self:
        if self.max_buffered_bytes < self.max_response_bytes:
            raise ValueError(f"max_buffered_bytes ({self.max_buffered_bytes}) must hold one answer of "
                             f"max_response_bytes ({self.max_response_bytes}): raise it too")  # fmt: skip
        return self


@dataclass(frozen=True)
class ConfigSource:
    """Where a config was read from: the file, the line of every key path, the document as read."""

    file: str = ""
    lines: Mapping[Loc, int] = field(default_factory=dict)
    data: Any = None


class Config(_Frozen):
    gateway: GatewayConfig = GatewayConfig()
    """The gateway itself."""
    backends: Annotated[tuple[BackendConfig, ...], Field(min_length=1)]
    """The workers (at least one)."""
    agents: Annotated[tuple[AgentConfig, ...], Field(min_length=1)]
    """The agents (at least one)."""
    _source: ConfigSource = PrivateAttr(default_factory=ConfigSource)

    def error(self, loc: Loc, message: str) -> ConfigError:
        """A ConfigError about the key at ``loc`` (e.g. ``("gateway", "policy")``), naming its file and
        line where the config was read from a file; for checks made after loading (the policy's name, the
        options that do nothing where they stand)."""
        src = self._source
        return ConfigError(message, file=src.file, line=nearest_line(src.lines, loc), key=dotted(loc, src.data))

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        _unique("backends", [b.name for b in self.backends])
        _unique("agents", [a.name for a in self.agents])
        urls = [b.url for b in self.backends]
        for i, u in enumerate(urls):
            if u in urls[:i]:
                raise _At(("backends", i, "url"), f"URL {u!r} is used by two backends")
        for i, b in enumerate(self.backends):
            if b.profile is not None:
                _check_profile(("backends", i, "profile"), b.profile)
            if b.sim is not None:
                _check_profile(("backends", i, "sim", "profile"), b.sim.profile)
            if b.launch is not None and b.engine not in (None, "vllm"):
                raise _At(("backends", i, "engine"), f"launch: starts vLLM, not {b.engine} (drop launch: and start "
                          "the worker yourself, or drop engine:)")  # fmt: skip
        _check_shared_gpus(self.backends)
        served = {b.model for b in self.backends}
        for i, agent in enumerate(self.agents):
            for j, m in enumerate(agent.models):
                if m not in served:
                    raise _At(("agents", i, "models", j), f"no backend serves model {m!r}")
        keys: dict[str, str] = {}
        for i, agent in enumerate(self.agents):
            for j, k in enumerate(agent.api_keys):
                if k in keys:
                    raise _At(("agents", i, "api_keys", j), f"API key also belongs to agent {keys[k]!r}")
                keys[k] = agent.name
        po = self.gateway.policy_options
        if po.wrong_answer_stage_s > 0 and po.wrong_answer_s == 0:
            raise _At(("gateway", "policy_options", "wrong_answer_stage_s"),
                      "needs wrong_answer_s > 0 (wrong_answer_s: 0 selects Chimera's slack rule, which prices no "
                      "wrong answer)")  # fmt: skip
        if po.sla_miss_s is not None and po.wrong_answer_s == 0:
            raise _At(("gateway", "policy_options", "sla_miss_s"),
                      "needs wrong_answer_s > 0 (wrong_answer_s: 0 selects Chimera's slack rule, which keeps the SLA "
                      "a constraint)")  # fmt: skip
        da = self.gateway.default_agent
        if da is not None:
            if da not in {a.name for a in self.agents}:
                raise _At(("gateway", "default_agent"), f"no agent named {da!r}")
            if keys:
                raise _At(("gateway", "default_agent"), "default_agent is only allowed when no agent has keys")
        return self

    # -- lookups used on the hot path (cheap; the objects are frozen) --
    def agent(self, name: str) -> AgentConfig | None:
        return next((a for a in self.agents if a.name == name), None)

    def backend(self, name: str) -> BackendConfig | None:
        return next((b for b in self.backends if b.name == name), None)

    @property
    def served_models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b.model for b in self.backends))

    @property
    def uses_keys(self) -> bool:
        return any(a.api_keys for a in self.agents)


def _check_profile(loc: tuple[str | int, ...], name: str) -> None:
    from router.core.errors import ProfileError
    from router.core.profile import load_profile

    try:
        load_profile(name)
    except ProfileError as exc:
        raise _At(loc, str(exc)) from None


def _check_shared_gpus(backends: tuple[BackendConfig, ...]) -> None:
    """Simulated workers on one ``gpu`` time-share one modelled GPU (backends.sim.gpu), which needs one clock:
    they must run at the same ``speedup``."""
    first: dict[int, BackendConfig] = {}
    for i, b in enumerate(backends):
        if b.sim is None or b.gpu is None:
            continue
        other = first.setdefault(b.gpu, b)
        if other.sim is not None and other.sim.speedup != b.sim.speedup:
            raise _At(("backends", i, "sim", "speedup"),
                      f"simulated workers {other.name} and {b.name} share gpu {b.gpu} but not their speedup "
                      f"({other.sim.speedup:g} vs {b.sim.speedup:g})")  # fmt: skip


def _unique(section: str, names: list[str]) -> None:
    for i, n in enumerate(names):
        if n in names[:i]:
            raise _At((section, i, "name"), f"duplicate name {n!r}")


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> Config:
    """Read, substitute, validate. Raises ConfigError (never a traceback for a user's mistake)."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config: {exc}", file=file) from exc
    return parse_config(text, file=file, env=os.environ if env is None else env)


def parse_config(text: str, *, file: str = "<config>", env: Mapping[str, str]) -> Config:
    data, lines = read_yaml(text, file=file, env=env)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        ctx_err = (err.get("ctx") or {}).get("error")
        msg = err["msg"]
        if isinstance(ctx_err, _At):
            loc = loc + ctx_err.loc if loc else ctx_err.loc
            msg = str(ctx_err)
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(msg + more, file=file, line=nearest_line(lines, loc), key=dotted(loc, data)) from exc
    config._source = ConfigSource(file, lines, data)
    return config
