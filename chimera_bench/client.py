"""The bench's clients: the official async ``openai`` SDK, one request per agent step, streamed.

Each role's requests go out as the config's agent of that name: with its first API key as the
Bearer token, else with the ``X-Agent`` header (and ``x-workflow-id`` / ``x-workflow-stage`` always). TTFT is measured
here, at the first content token the client receives; e2e when the stream ends. Where the gateway keeps a
predictor (a ``gateway.predictor`` section, or the predictive policy: :func:`posts_feedback`), every answer's
verdict (it ends with ``[correct]``) is posted back as ``POST /v1/feedback {"request_id", "correct"}`` (the
request id from the answer's ``X-Request-Id``), so the gateway learns which model answers which role well;
otherwise nothing extra is sent (the comparison's load stays the workload's).

Two ways to offer load: :func:`open_loop` (Poisson arrivals of workflows at a rate) and
:func:`closed_loop` (N users, each starting a new workflow as soon as its last one ends). One
process's event loop parsing every streamed chunk through the SDK becomes the bottleneck at a few
thousand chunks/s (~20 streamed requests/s of a few hundred tokens), so the load can be split over
``--clients`` processes (:func:`run_shard`): shard ``k`` of ``n`` runs workflow (or user) ``i``
where ``i % n == k``, on the same arrival times and the same clock origin.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from chimera_bench.workloads import Step, Workflow, make_workflow
from router.core.config import Config
from router.core.errors import ChimeraError

if TYPE_CHECKING:
    from chimera_bench.peers import Route


@dataclass
class RequestRecord:
    workflow: str
    agent: str
    start: float  # seconds since the run's start
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    error: str | None = None
    request_id: str | None = None  # the gateway's X-Request-Id


@dataclass
class WorkflowRecord:
    id: str
    kind: str
    start: float
    end: float | None = None
    steps: int = 0
    success: bool = False
    success_strict: bool = False  # and the answer the last check passed was itself correct
    error: bool = False
    # the workflow's scheduled arrival (open loop), which decides whether it is measured: its actual start lags
    # by the client's scheduling, and a workflow due at a window's edge would fall on either side run to run
    arrival: float | None = None

    @property
    def at(self) -> float:
        """When the workflow counts as arrived: its scheduled arrival, else (closed loop) its start."""
        return self.start if self.arrival is None else self.arrival


@dataclass
class RunLog:
    requests: list[RequestRecord] = field(default_factory=list)
    workflows: list[WorkflowRecord] = field(default_factory=list)
    fleet_samples: list[dict[str, Any]] = field(default_factory=list)


def posts_feedback(config: Config, policy: str) -> bool:
    """Whether the bench posts each verdict to ``/v1/feedback``: where the gateway keeps a predictor (a
    ``gateway.predictor`` section, or a policy that routes on one), which learns answer quality from it."""
    from router.policies import USES_PREDICTOR

    return config.gateway.predictor is not None or policy in USES_PREDICTOR


class AgentClients:
    """One ``AsyncOpenAI`` per agent over ``pools`` connection pools; a workflow keeps to one pool.

    With one pool every step shares one set of keep-alive connections. Gateway replicas that share a
    port (SO_REUSEPORT) are handed connections, not requests, by the kernel, and a light load keeps
    only one or two connections open: several pools (``pools``, one per workflow by a hash of its id)
    make the load look like many users, each with their own connections, as a real fleet's does.
    """

    def __init__(
        self, base_url: str, config: Config, timeout_s: float = 600.0, pools: int = 1, feedback: bool | None = None,
        routes: Mapping[str, Route] | None = None,
    ) -> None:  # fmt: skip
        try:
            import openai
        except ImportError as exc:  # a core install has no openai; the dev extra does
            raise ChimeraError("chimera bench needs the openai SDK: pip install openai") from exc
        self._openai = openai
        self._roots = [
            openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=timeout_s)
            for _ in range(max(1, pools))
        ]
        self._clients: list[dict[str, Any]] = [{} for _ in self._roots]
        self._auth: dict[str, dict[str, str]] = {}
        self._models: dict[str, str] = {}
        for agent in config.agents:
            route = routes.get(agent.name) if routes is not None else None
            if route is not None:  # a peer router: its own URL for the agent, the model the agent names there
                key = route.api_key or "unused"
                self._auth[agent.name] = {"Authorization": f"Bearer {key}"}
                self._models[agent.name] = route.model
                for root, clients in zip(self._roots, self._clients, strict=True):
                    clients[agent.name] = root.with_options(base_url=route.url + "/v1", api_key=key)
                continue
            if agent.api_keys:
                self._auth[agent.name] = {"Authorization": f"Bearer {agent.api_keys[0]}"}
                options: dict[str, Any] = {"api_key": agent.api_keys[0]}
            else:
                self._auth[agent.name] = {"X-Agent": agent.name}
                options = {"default_headers": {"X-Agent": agent.name}}
            for root, clients in zip(self._roots, self._clients, strict=True):
                clients[agent.name] = root.with_options(**options)
        self.feedback = (posts_feedback(config, config.gateway.policy) if feedback is None else feedback) and not routes
        self._http = httpx.AsyncClient(base_url=base_url, timeout=10.0) if self.feedback else None

    def _hidden(self, step: Step) -> dict[str, Any]:
        """The step's ``sim`` fields (read by the simulated worker only); through a peer, also as ``metadata``,
        which SGLang's router keeps where it drops fields it does not know (backends/sim/api.py)."""
        if not self._models:
            return {"sim": step.sim}
        return {"sim": step.sim, "metadata": {"sim": json.dumps(step.sim)}}

    def has(self, agent: str) -> bool:
        return agent in self._auth

    async def close(self) -> None:
        for root in self._roots:
            await root.close()
        if self._http is not None:
            await self._http.aclose()

    async def post_feedback(self, rec: RequestRecord, correct: bool) -> None:
        """The answer's verdict to ``/v1/feedback`` (only with a gateway predictor; errors ignored)."""
        if self._http is None or rec.request_id is None:
            return
        with contextlib.suppress(httpx.HTTPError):
            await self._http.post(
                "/v1/feedback", json={"request_id": rec.request_id, "correct": correct}, headers=self._auth[rec.agent]
            )

    async def send(self, step: Step, workflow_id: str, t0: float, stage: int = 0) -> tuple[RequestRecord, str]:
        """Stream one step (``stage``: its index in the workflow); return its record and the answer's text."""
        rec = RequestRecord(workflow_id, step.agent, time.monotonic() - t0, prompt_tokens=step.prompt_words)
        client = self._clients[zlib.crc32(workflow_id.encode()) % len(self._clients)][step.agent]
        parts: list[str] = []
        start = time.monotonic()
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=self._models.get(step.agent, "auto"), messages=step.messages, max_tokens=step.max_tokens,
                stream=True,
                stream_options={"include_usage": True}, extra_body=self._hidden(step),
                extra_headers={"x-workflow-id": workflow_id, "x-workflow-stage": str(stage)},
            )  # fmt: skip
            rec.request_id = raw.headers.get("x-request-id")
            if (served := raw.headers.get("x-litellm-model-name")) is not None:  # LiteLLM answers as its group
                rec.model = served.partition("/")[2] or served
            stream = raw.parse()
            async for chunk in stream:
                if chunk.usage is not None:
                    rec.output_tokens = chunk.usage.completion_tokens
                    rec.prompt_tokens = chunk.usage.prompt_tokens
                if chunk.model and not rec.model:
                    rec.model = chunk.model
                for choice in chunk.choices:
                    if choice.delta.content:
                        if rec.ttft_s is None:
                            rec.ttft_s = time.monotonic() - start
                        parts.append(choice.delta.content)
            rec.e2e_s = time.monotonic() - start
        except self._openai.APIError as exc:
            rec.error = type(exc).__name__ + (f" {exc.status_code}" if hasattr(exc, "status_code") else "")
        text = "".join(parts)
        if rec.error is None and rec.output_tokens == 0:
            rec.output_tokens = len(text.split())
        return rec, text


Progress = Callable[[int], None]


async def run_workflow(
    clients: AgentClients, wf: Workflow, log: RunLog, t0: float, on_request: Progress, arrival: float | None = None
) -> None:
    rec = WorkflowRecord(wf.id, wf.kind, time.monotonic() - t0, arrival=arrival)
    log.workflows.append(rec)
    while (step := wf.next_step()) is not None:
        req, text = await clients.send(step, wf.id, t0, wf.steps)
        log.requests.append(req)
        on_request(1)
        rec.steps += 1
        if req.error is not None:
            rec.error = True
            break
        wf.record(step, text)
        await clients.post_feedback(req, wf.answer_was_good(step, text))  # a checker: its verdict was right
    rec.end = time.monotonic() - t0
    rec.success = not rec.error and wf.succeeded  # its last answer ended with [correct]
    rec.success_strict = not rec.error and wf.succeeded_strict


def poisson_arrivals(rate: float, horizon_s: float, seed: int) -> list[float]:
    """Arrival offsets (s) of a Poisson process at ``rate``/s over ``horizon_s``, fixed by ``seed``."""
    rng = random.Random(f"arrivals:{seed}:{rate}")
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= horizon_s:
            return out
        out.append(t)


async def open_loop(
    clients: AgentClients, workload: str, seed: int, rate: float, horizon_s: float, drain_s: float,
    log: RunLog, on_request: Progress, t0: float, shard: tuple[int, int] = (0, 1),
) -> None:  # fmt: skip
    """Start workflow ``i`` at the ``i``-th Poisson arrival; wait up to ``drain_s`` for stragglers.
    ``shard`` ``(k, n)``: only the workflows with ``i % n == k``."""
    tasks: list[asyncio.Task[None]] = []
    k, n = shard
    for i, at in enumerate(poisson_arrivals(rate, horizon_s, seed)):
        if i % n != k:
            continue
        await asyncio.sleep(max(0.0, at - (time.monotonic() - t0)))
        wf = make_workflow(workload, seed, i)
        tasks.append(asyncio.create_task(run_workflow(clients, wf, log, t0, on_request, arrival=at)))
    await asyncio.sleep(max(0.0, horizon_s - (time.monotonic() - t0)))
    await _drain(tasks, drain_s)


async def closed_loop(
    clients: AgentClients, workload: str, seed: int, users: int, horizon_s: float, drain_s: float,
    log: RunLog, on_request: Progress, t0: float, shard: tuple[int, int] = (0, 1),
) -> None:  # fmt: skip
    """``users`` users; user ``u``'s ``k``-th workflow is index ``u * 1_000_000 + k``. ``shard``
    ``(k, n)``: only the users with ``u % n == k``."""

    async def user(u: int) -> None:
        await asyncio.sleep(random.Random(f"user:{seed}:{u}").uniform(0, 1.0))  # stagger the start
        k = 0
        while time.monotonic() - t0 < horizon_s:
            await run_workflow(clients, make_workflow(workload, seed, u * 1_000_000 + k), log, t0, on_request)
            k += 1

    tasks = [asyncio.create_task(user(u)) for u in range(users) if u % shard[1] == shard[0]]
    await asyncio.sleep(max(0.0, horizon_s - (time.monotonic() - t0)))
    await _drain(tasks, drain_s)


@dataclass(frozen=True)
class ShardJob:
    """What one load-client process runs (picklable: it crosses to a spawned process)."""

    url: str
    config: Config
    workload: str
    kind: str  # "rate" or "users"
    load: float
    seed: int
    horizon_s: float
    drain_s: float
    shard: tuple[int, int]
    pools: int = 1  # connection pools (AgentClients)
    feedback: bool = False  # post every verdict to /v1/feedback (posts_feedback)
    routes: dict[str, Route] | None = None  # through a peer router: each agent's URL and model (bench.peers)


def warm_up() -> int:
    """Run in each client process before the clock starts (the SDK imported, the process up); its pid."""
    import openai  # noqa: F401

    time.sleep(0.2)  # so the pool hands the other warm-ups to other processes
    return os.getpid()


def run_shard(job: ShardJob, t0: float) -> RunLog:
    """One load-client process's share of the run. ``t0``: the run's origin on ``time.monotonic()``, a
    system-wide clock (CLOCK_MONOTONIC), so every process's records share it."""
    return asyncio.run(_run_shard(job, t0))


async def _run_shard(job: ShardJob, t0: float) -> RunLog:
    log = RunLog()
    clients = AgentClients(job.url, job.config, pools=job.pools, feedback=job.feedback, routes=job.routes)
    try:
        args = (job.horizon_s, job.drain_s, log, lambda _: None, t0)
        if job.kind == "users":
            await closed_loop(clients, job.workload, job.seed, int(job.load), *args, shard=job.shard)
        else:
            await open_loop(clients, job.workload, job.seed, job.load, *args, shard=job.shard)
    finally:
        await clients.close()
    return log


async def _drain(tasks: list[asyncio.Task[None]], drain_s: float) -> None:
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=drain_s)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def poll_fleet(gateway_url: str, log: RunLog, t0: float, every_s: float = 0.5) -> None:
    """Sample the gateway's /fleet (each worker's KV use, running, waiting) until cancelled."""
    async with httpx.AsyncClient(timeout=2.0) as http:
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                body = (await http.get(gateway_url + "/fleet")).json()
                log.fleet_samples.append({"t": time.monotonic() - t0, "backends": body.get("backends", [])})
            await asyncio.sleep(every_s)


def counters_since(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Each worker's counters over a run: ``after`` less ``before`` (vLLM's counters run from the
    worker's start, and a real worker serves many runs; a counter that went down means the worker
    restarted, and then ``after`` is what it counted since)."""
    out: dict[str, dict[str, float]] = {}
    for name, now in after.items():
        was = before.get(name, {})
        out[name] = {k: v - was.get(k, 0.0) if v >= was.get(k, 0.0) else v for k, v in now.items()}
    return out


_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total")
_TTFT = "vllm:time_to_first_token_seconds"


def _counter_key(name: str, labels: dict[str, str]) -> str | None:
    """The bench's key of one exposition sample, or None for a sample it does not keep."""
    if name in _COUNTERS:
        return name.removeprefix("vllm:").removesuffix("_total")
    if name == _TTFT + "_bucket":
        return f"ttft_le_{labels['le']}"
    if name in (_TTFT + "_count", _TTFT + "_sum"):
        return "ttft_" + name.rpartition("_")[2]
    return None


async def scrape_workers(urls: dict[str, str]) -> dict[str, dict[str, float]]:
    """Each worker's vLLM counters that matter to the bench: prefix cache, preemptions, and the engine's own
    TTFT histogram (``ttft_le_<bound>``, ``ttft_count``, ``ttft_sum``: TTFT as the worker saw it, without
    the gateway, the client or anything between them). Samples of several engines or models add up; an
    unparseable exposition keeps what was read before the bad line."""
    out: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(timeout=2.0) as http:
        for name, url in urls.items():
            try:
                text = (await http.get(url + "/metrics")).text
            except httpx.HTTPError:
                continue
            vals: dict[str, float] = {}
            with contextlib.suppress(ValueError):
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        key = _counter_key(sample.name, sample.labels)
                        if key is not None:
                            vals[key] = vals.get(key, 0.0) + float(sample.value)
            out[name] = vals
    return out
