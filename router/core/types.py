"""Plain data passed between the gateway, fleet state and routing policies.

Policies see only these types: ``choose(RequestFeatures, FleetSnapshot) -> Decision``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from router.core.errors import NoHealthyWorker

Endpoint = Literal["chat", "completions", "responses"]
#: the inference servers whose metrics the prober reads (backends/engines.py maps each to the fleet view)
Engine = Literal["vllm", "sglang", "tgi", "trtllm", "lightllm"]
ENGINES: tuple[Engine, ...] = ("vllm", "sglang", "tgi", "trtllm", "lightllm")


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What a router can see of a request before dispatch (never the simulator-only ``sim`` field)."""

    agent: str
    endpoint: Endpoint
    models: tuple[str, ...]  # the models this request may be served by (requested ∩ allowed)
    prompt_tokens: int  # cheap estimate
    max_tokens: int | None
    stream: bool
    message_count: int = 1
    sequences: int = 1  # answers it asks for: n x (the prompts of a batched completion)
    seq: int = 0  # the gateway's request counter (round_robin uses it, so the policy stays pure)
    priority: int = 1
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    e2e_slo_ms: float | None = None
    min_quality: float | None = None
    workflow_id: str | None = None
    prefix_hashes: tuple[int, ...] = ()  # hashes of the prompt's leading blocks (prefix affinity)
    workflow_stage: int | None = None  # x-workflow-stage: 0 for a workflow's first request
    sketch: tuple[float, ...] = ()  # hashed bag of words of the prompt's head (predictor.sketch)
    terms: tuple[int, ...] = ()  # hashed ids of the task's distinct words (predictor.sketch.text_features)
    prefix_hits: Mapping[str, float] = field(default_factory=dict)  # worker -> expected cached share


@dataclass(frozen=True, slots=True)
class BackendView:
    """One worker as a policy sees it at dispatch time."""

    name: str
    model: str
    healthy: bool = True
    kv_budget_tokens: int = 0
    max_model_len: int = 8192
    tags: frozenset[str] = frozenset()
    inflight_requests: int = 0  # this gateway's (and, with Redis, every replica's) outstanding requests
    inflight_tokens: int = 0  # reserved prompt + predicted output tokens of those requests
    # prompt tokens of this gateway's (and, with Redis, every replica's) streamed requests on the worker that
    # have had no first token yet: the prefill work queued ahead of a new request (vLLM admits up to
    # max_num_seqs requests as "running" before their prefill is done, so its waiting count does not show it);
    # other replicas' first tokens reach this view within about two sync intervals
    pending_prefill_tokens: int = 0
    running: int | None = None  # scraped requests in its batch (vllm:num_requests_running; None until a scrape)
    waiting: int | None = None  # scraped requests queued (vllm:num_requests_waiting)
    kv_usage: float | None = None  # scraped KV-cache use, 0..1 (vllm:kv_cache_usage_perc)
    metrics_age_s: float | None = None
    consecutive_failures: int = 0
    last_success_age_s: float | None = None  # since the last successful probe or request (None: never)
    ttft_ewma_s: float | None = None
    tpot_ewma_s: float | None = None
    # How this worker's recent requests ran against their predictions at dispatch (observed / predicted,
    # a geometric EWMA; 1.0 until one is seen): what the predictive policy corrects its estimates by.
    ttft_bias: float = 1.0
    tpot_bias: float = 1.0
    gpu: str | None = None  # the GPU it time-shares with the workers of the same key (BackendConfig.shared_gpu)
    engine: str | None = None  # the server it runs: configured, else what its metrics said (None: not yet known)


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """The workers a policy chooses among (``backends``) and, where those are a selection, every worker of the
    fleet (``fleet``): a worker's neighbours on its GPU may serve other models."""

    backends: tuple[BackendView, ...]
    taken_at: float = 0.0
    fleet: tuple[BackendView, ...] = ()

    @property
    def everyone(self) -> tuple[BackendView, ...]:
        return self.fleet or self.backends

    def among(self, backends: tuple[BackendView, ...]) -> FleetSnapshot:
        """A selection of this snapshot's workers, the whole fleet kept."""
        return FleetSnapshot(backends, self.taken_at, self.everyone)

    def by_name(self, name: str) -> BackendView | None:
        return next((b for b in self.backends if b.name == name), None)

    def eligible(self, features: RequestFeatures) -> FleetSnapshot:
        """Healthy workers serving one of the request's models whose context fits the prompt."""
        keep = tuple(
            b
            for b in self.backends
            if b.healthy and b.model in features.models and features.prompt_tokens < b.max_model_len
        )
        return self.among(keep)

    def servable(self, features: RequestFeatures) -> FleetSnapshot:
        """The eligible workers, else any healthy one serving the request's models: the prompt estimate is rough,
        so where it exceeds every healthy worker's context a worker judges the real length (it answers 400 if the
        prompt is indeed too long). Raises NoHealthyWorker when no healthy worker serves them."""
        eligible = self.eligible(features)
        if eligible.backends:
            return eligible
        healthy = tuple(b for b in self.backends if b.healthy and b.model in features.models)
        if not healthy:
            raise NoHealthyWorker(f"no healthy worker serves {', '.join(features.models)}")
        return self.among(healthy)


@dataclass(frozen=True, slots=True)
class Decision:
    """Workers in order of preference: the first is tried, the rest are retry fallbacks."""

    ranked: tuple[str, ...]
    reason: str = ""
    predicted: Mapping[str, float] = field(default_factory=dict)  # e.g. {"ttft_ms": …} of the choice


Policy = Callable[[RequestFeatures, FleetSnapshot], Decision]
