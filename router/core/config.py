"""YAML config → frozen, validated objects. Parsed once at start-up and passed explicitly.

``load_config(path)`` substitutes ``${VAR}`` from the environment, validates with pydantic and
raises :class:`router.core.errors.ConfigError` whose message names ``file:line: key``.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from router.core.errors import ConfigError
from router.core.yamlload import Loc, dotted, nearest_line, read_yaml

AUTO_MODEL = "auto"

PosFloat = Annotated[float, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(gt=0)]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        """``kv_budget_tokens: true`` is a mistake, not 1: pydantic's lax mode would take a boolean for a
        number (a number written as a string stays accepted, as ``${VAR}`` values are strings)."""
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key) if isinstance(key, str) else None
                if field is not None and isinstance(value, bool):
                    kinds = _kinds(field.annotation)
                    if bool not in kinds and kinds & {int, float}:
                        raise _At((key,), f"expected a number, not {str(value).lower()}")
        return data


class SLA(_Frozen):
    """Latency objectives of an agent; ``None`` means no objective of that kind."""

    ttft_ms: PosFloat | None = None
    tpot_ms: PosFloat | None = None
    e2e_ms: PosFloat | None = None


class SimSpec(_Frozen):
    """A simulated worker that ``chimera serve`` starts at the backend's URL."""

    profile: str
    speedup: PosFloat = 1.0
    seed: int = 0
    kv_tokens: PosInt | None = None
    max_num_seqs: PosInt | None = None
    max_num_batched_tokens: PosInt | None = None


class LaunchSpec(_Frozen):
    """A real vLLM worker that ``chimera workers up`` starts."""

    hf_model: str
    gpu: NonNegInt = 0
    kv_cache_gib: PosFloat
    extra_args: tuple[str, ...] = ()


class BackendConfig(_Frozen):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    url: str
    model: Annotated[str, Field(min_length=1)]
    kv_budget_tokens: PosInt
    max_model_len: PosInt = 8192
    gpu: NonNegInt | None = None
    tags: tuple[str, ...] = ()
    sim: SimSpec | None = None
    launch: LaunchSpec | None = None
    profile: str | None = None  # hardware profile (h200-* name or JSON path) for the predictor's prior
    # what the worker runs (vLLM's --scheduling-policy); under "priority" the gateway sends each request's
    # priority in its body (router.priority), and `chimera serve` / `chimera workers up` start it that way
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    # the worker's own API key (vLLM's --api-key / VLLM_API_KEY): sent as `Authorization: Bearer` on every
    # request the gateway makes to it (never the caller's key), and given to the vLLM `chimera workers up` starts
    api_key: str | None = None

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
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"


class AgentConfig(_Frozen):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    api_keys: tuple[Annotated[str, Field(min_length=1)], ...] = ()
    models: Annotated[tuple[str, ...], Field(min_length=1)]
    sla: SLA = SLA()
    priority: NonNegInt = 1
    min_quality: Annotated[float, Field(ge=0, le=1)] | None = None
    on_overload: Literal["queue", "reject", "degrade"] = "queue"
    rpm: PosInt | None = None
    tpm: PosInt | None = None


class Timeouts(_Frozen):
    """Worker-client timeouts, in seconds."""

    connect_s: PosFloat = 2.0
    first_byte_s: PosFloat = 60.0  # streamed requests: until the first SSE byte (queueing + prefill)
    between_chunks_s: PosFloat = 30.0
    response_s: PosFloat = 600.0  # non-streamed requests: the whole answer comes as its first byte


class HealthConfig(_Frozen):
    probe_interval_s: PosFloat = 1.0
    probe_timeout_s: PosFloat = 1.0
    eject_after_failures: PosInt = 3
    readmit_after_successes: PosInt = 1
    # A worker that fails again before serving one request after its re-admission (on probation) is
    # ejected at its first failure and kept out at least this long, doubling each time up to the max:
    # a worker whose /health says ok while its completions fail stops costing retries (outlier ejection).
    eject_backoff_s: Annotated[float, Field(ge=0)] = 1.0
    eject_backoff_max_s: PosFloat = 60.0


class PolicyOptions(_Frozen):
    long_prompt_tokens: PosInt = 2048  # length_split: prompts at or above this go to `long` workers
    long_tag: str = "long"
    latency_slack: Annotated[float, Field(ge=1.0)] = 1.3  # predictive: most capable worker within slack x fastest
    affinity_load_ratio: Annotated[float, Field(ge=1.0)] = 2.0  # predictive: prefix affinity ignored above this
    # worker's in-flight requests relative to the least loaded candidate (+ affinity_load_slack)
    affinity_load_slack: NonNegInt = 4
    # predictive: what a wrong answer costs the workflow (its retry), in modelled seconds like the SLOs;
    # the policy takes the least e2e + P(wrong) x this (0: Chimera's slack rule alone)
    wrong_answer_s: Annotated[float, Field(ge=0)] = 2.0
    # predictive: added to wrong_answer_s per stage of the request's workflow (x-workflow-stage, capped at 16):
    # a wrong answer late in a workflow costs more (more done work rides on it, fewer retries are left);
    # only with the expected-cost rule (wrong_answer_s > 0)
    wrong_answer_stage_s: Annotated[float, Field(ge=0)] = 0.0
    # predictive: scale each worker's predicted TTFT and decode time by how its recent requests ran
    # against their predictions (observed / predicted, an EWMA kept by the gateway; 1 until seen)
    latency_feedback: bool = True


class PredictorConfig(_Frozen):
    """The learned latency predictor (``gateway.predictor``); its absence means a prior-only predictor
    where the policy is ``predictive``, and no predictor (no sketches, no refits) otherwise."""

    model: str | None = None  # artifact from `chimera predictor train`, loaded at start-up
    refit_interval_s: Annotated[float, Field(ge=0)] = 30.0  # 0: never refit online
    window: PosInt = 5000  # completions kept for online refits (bucketed by load)
    min_samples: PosInt = 300  # a refit needs at least this many completions in the window
    save: str | None = None  # where online refits are written (default: not saved)


class AdmissionConfig(_Frozen):
    """Overload handling (``gateway.admission``; absent: every request is dispatched at once).
    See docs/OVERLOAD.md."""

    kv_full_ratio: Annotated[float, Field(gt=0, le=1)] = 0.8  # a worker is full when reservations reach this
    max_waiting: NonNegInt | None = None  # ... or when vLLM reports more waiting requests than this
    priority_headroom: Annotated[float, Field(ge=0, lt=1)] = 0.05  # each priority level below 0 may fill
    # this much less of the ratio (priority 5: 0.8 x 0.75), so urgent agents always find room
    max_queue: PosInt = 1000  # queued requests at most (beyond: 429)
    max_queue_wait_s: PosFloat = 30.0  # the longest any request waits, SLA or not
    aging_s: PosFloat = 5.0  # a queued request gains one priority level per aging_s waited
    tick_s: PosFloat = 0.05  # the queue re-checks capacity this often (probes, other replicas)
    degrade_max_tokens: PosInt = 256  # on_overload: degrade caps max_tokens to this
    predicted_deadline: bool = True  # also unservable when the policy predicts a missed SLA


class EnginePriorityConfig(_Frozen):
    """The ``priority`` sent to workers with ``scheduling_policy: priority`` (``gateway.engine_priority``;
    see router/priority.py)."""

    aging_s: PosFloat = 5.0  # a request sent this much later counts one priority level less urgent
    # with the predictive policy: one level more per this many predicted output tokens left in the request's
    # workflow (shortest-remaining-workflow first, as Chimera's scheduler); absent: agent priority and age only
    tokens_per_level: PosFloat | None = None


class GatewayConfig(_Frozen):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    state: str = "memory"
    policy: str = "least_outstanding"  # a name of the policy registry (router.policies), checked at start-up
    policy_options: PolicyOptions = PolicyOptions()
    request_log: str | None = None
    max_body_bytes: PosInt = 4 * 1024 * 1024
    default_agent: str | None = None
    max_attempts: PosInt = 3
    timeouts: Timeouts = Timeouts()
    health: HealthConfig = HealthConfig()
    predictor: PredictorConfig | None = None
    admission: AdmissionConfig | None = None  # overload: admission, queues, degradation
    engine_priority: EnginePriorityConfig = EnginePriorityConfig()
    admin_key: str | None = None  # when set, /fleet and /metrics need `Authorization: Bearer <admin_key>`

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
        if parts.scheme not in ("redis", "rediss", "unix") or not (parts.hostname or parts.path):
            raise ValueError(f"state must be 'memory' or a redis:// URL, not {v!r}")
        from router.core.stateurl import check_redis_url

        try:
            check_redis_url(v)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        return v


@dataclass(frozen=True)
class ConfigSource:
    """Where a config was read from: the file, the line of every key path, the document as read."""

    file: str = ""
    lines: Mapping[Loc, int] = field(default_factory=dict)
    data: Any = None


class Config(_Frozen):
    gateway: GatewayConfig = GatewayConfig()
    backends: Annotated[tuple[BackendConfig, ...], Field(min_length=1)]
    agents: Annotated[tuple[AgentConfig, ...], Field(min_length=1)]
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


class _At(ValueError):
    """A cross-field error raised inside a validator, carrying the path of the offending key."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def _kinds(annotation: Any) -> set[Any]:
    """The plain types an annotation admits (through ``Annotated``, ``Optional`` and unions)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _kinds(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return set().union(*(_kinds(a) for a in get_args(annotation)))
    return {annotation}


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
