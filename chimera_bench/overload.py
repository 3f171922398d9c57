"""The overload scenario (issue 6): an interactive agent keeps its SLA while batch agents flood.

Four agents share a fleet of simulated 0.5B workers with a small KV budget:

    interactive  priority 0, on_overload queue,   streamed, short answers, tight TTFT/e2e SLA
    batch        priority 5, on_overload degrade, long answers (capped when degraded)
    crawler      priority 5, on_overload reject,  long answers
    bulk         priority 9, on_overload queue,   medium answers, loose SLA (progresses by aging)

*Capacity* is what admission control admits: ``kv_full_ratio`` x every worker's KV budget, in
reserved token-seconds per second; each request reserves its prompt + ``max_tokens`` for about its
answer's length x the step time. The interactive and bulk rates are fixed; the batch and crawler
rates make the total demand ``multiple`` x capacity. Load runs for ``duration_s``, then only bulk
requests arrive for ``drain_s`` (load drops: the lowest priority must progress).

Every request goes through the official ``openai`` SDK (``max_retries=0``: a 429 is recorded, not
retried). :func:`scenario_config` gives the gateway config, :func:`drive` the load,
:func:`summarize` per-agent figures (with the gateway's request log for queue waits).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL = "qwen2.5-0.5b"
PROFILE = "h200-qwen2.5-0.5b"
MAX_MODEL_LEN = 4096  # the workers' max_model_len (prompt + answer)
STEP_S = 0.0026  # the profile's decode step at a small batch, seconds at speedup 1
WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega router worker token".split()


@dataclass(frozen=True, slots=True)
class AgentLoad:
    agent: str
    priority: int
    on_overload: str
    stream: bool
    prompt_words: int
    max_tokens: int
    output_tokens: int
    sla_ms: Mapping[str, float]  # at speedup 1; scaled by 1/speedup
    rate_rps: float = 0.0  # at speedup 1; scaled by speedup (set by the scenario for batch/crawler)
    during_drain: bool = False


AGENTS = (
    AgentLoad("interactive", 0, "queue", True, 30, 32, 24, {"ttft_ms": 250, "e2e_ms": 600}, rate_rps=16.0),
    AgentLoad("batch", 5, "degrade", False, 120, 320, 300, {"e2e_ms": 6000}),
    AgentLoad("crawler", 5, "reject", False, 120, 320, 300, {"e2e_ms": 6000}),
    AgentLoad("bulk", 9, "queue", False, 60, 128, 100, {"e2e_ms": 5000}, rate_rps=4.0, during_drain=True),
)


@dataclass(frozen=True, slots=True)
class Scenario:
    multiple: float = 3.0
    duration_s: float = 20.0
    drain_s: float = 6.0
    seed: int = 0
    speedup: float = 0.25
    workers: int = 2
    kv_tokens: int = 4096
    kv_full_ratio: float = 0.8
    degrade_max_tokens: int = 64
    aging_s: float = 2.0
    admission: bool = True
    adaptive: bool = False  # gateway.admission.adaptive: per-worker concurrency limits moved by feedback
    policy: str = "least_outstanding"
    scheduling_policy: str = "fcfs"  # the workers' (vLLM's); "priority": the agents' priorities reach their queues
    # Each request asks for this many times its agent's max_tokens (answers as long as before; the load is the same
    # multiple of capacity): apps set max_tokens loosely, and a reservation then holds KV the answer never uses.
    max_tokens_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.max_tokens_scale < 1.0:
            raise ValueError("max_tokens_scale is at least 1 (a smaller max_tokens would cut the answers short)")
        longest = max(_prompt_tokens(a) + round(a.max_tokens * self.max_tokens_scale) for a in AGENTS)
        if longest > MAX_MODEL_LEN:
            raise ValueError(f"max_tokens_scale {self.max_tokens_scale:g} asks for {longest} tokens, over the "
                             f"workers' max_model_len {MAX_MODEL_LEN}")  # fmt: skip

    def agents(self) -> tuple[AgentLoad, ...]:
        """The agents with rates in real requests per second (batch and crawler fill the multiple)."""
        fixed = [a for a in AGENTS if a.rate_rps > 0]
        cap = self.capacity_tok_s()
        demand = sum(a.rate_rps * self.speedup * self.occupancy_tok_s(a) for a in fixed)
        flood = [a for a in AGENTS if a.rate_rps == 0]
        each = max(0.0, self.multiple * cap - demand) / len(flood)
        out = [_replace_rate(a, a.rate_rps * self.speedup) for a in fixed]
        out += [_replace_rate(a, each / self.occupancy_tok_s(a)) for a in flood]
        return tuple(sorted(out, key=lambda a: a.priority))

    def capacity_tok_s(self) -> float:
        return self.workers * self.kv_full_ratio * self.kv_tokens

    def occupancy_tok_s(self, a: AgentLoad) -> float:
        """Reserved token-seconds of one request: (prompt + max_tokens) x its answer's duration."""
        return (_prompt_tokens(a) + a.max_tokens) * (0.015 + a.output_tokens * STEP_S) / self.speedup


def _prompt_tokens(a: AgentLoad) -> int:
    return math.ceil(a.prompt_words * 6.5 / 4) + 4


def _replace_rate(a: AgentLoad, rate: float) -> AgentLoad:
    return AgentLoad(a.agent, a.priority, a.on_overload, a.stream, a.prompt_words, a.max_tokens,
                     a.output_tokens, a.sla_ms, rate, a.during_drain)  # fmt: skip


def sla_ms(s: Scenario, a: AgentLoad) -> dict[str, float]:
    return {k: v / s.speedup for k, v in a.sla_ms.items()}


def scenario_config(s: Scenario, urls: Mapping[str, str], *, sims: bool = False,
                    request_log: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The gateway config as plain data (``Config.model_validate`` it, or write it as YAML for
    ``chimera serve``; ``sims=True`` adds ``sim:`` so serve starts the workers)."""
    backends = []
    for i, (name, url) in enumerate(urls.items()):
        b: dict[str, Any] = {"name": name, "url": url, "model": MODEL, "kv_budget_tokens": s.kv_tokens,
                             "max_model_len": MAX_MODEL_LEN, "profile": PROFILE,
                             "scheduling_policy": s.scheduling_policy}  # fmt: skip
        if sims:
            b["sim"] = {"profile": PROFILE, "speedup": s.speedup, "seed": s.seed * 100 + i, "kv_tokens": s.kv_tokens}
        backends.append(b)
    agents = [{"name": a.agent, "models": [MODEL], "priority": a.priority, "on_overload": a.on_overload,
               "sla": sla_ms(s, a)} for a in AGENTS]  # fmt: skip
    gateway: dict[str, Any] = {"policy": s.policy, "request_log": request_log,
                               "health": {"probe_interval_s": 0.25}}  # fmt: skip
    if s.admission:
        gateway["admission"] = {"kv_full_ratio": s.kv_full_ratio, "degrade_max_tokens": s.degrade_max_tokens,
                                "aging_s": s.aging_s, "adaptive": s.adaptive}  # fmt: skip
    return {"gateway": gateway, "backends": backends, "agents": agents}


@dataclass(slots=True)
class Outcome:
    agent: str
    sent_at: float
    status: int
    e2e_s: float
    ttft_s: float | None = None
    retry_after: str | None = None
    degraded: str | None = None
    error: str | None = None


async def drive(base_url: str, s: Scenario, *, request_timeout_s: float = 120.0) -> list[Outcome]:
    """Open-loop Poisson arrivals per agent for ``duration_s`` (+ ``drain_s`` for bulk); waits for
    every answer."""
    import openai

    rng = random.Random(s.seed)
    outcomes: list[Outcome] = []
    tasks: list[asyncio.Task[None]] = []
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                                  timeout=request_timeout_s) as client:  # fmt: skip
        t0 = time.perf_counter()
        for a in s.agents():
            end = s.duration_s + (s.drain_s if a.during_drain else 0.0)
            at = rng.expovariate(a.rate_rps) if a.rate_rps > 0 else math.inf
            while at < end:
                tasks.append(asyncio.create_task(_one(client, a, t0 + at, t0, rng.randrange(1 << 30), outcomes,
                                                      round(a.max_tokens * s.max_tokens_scale))))  # fmt: skip
                at += rng.expovariate(a.rate_rps)
        await asyncio.gather(*tasks)
    return sorted(outcomes, key=lambda o: o.sent_at)


async def _one(client: Any, a: AgentLoad, when: float, t0: float, seed: int, out: list[Outcome],
               max_tokens: int) -> None:  # fmt: skip
    import openai

    await asyncio.sleep(max(0.0, when - time.perf_counter()))
    words = random.Random(seed).choices(WORDS, k=a.prompt_words)
    kwargs: dict[str, Any] = {
        "model": "auto", "messages": [{"role": "user", "content": " ".join(words)}], "max_tokens": max_tokens,
        "extra_body": {"sim": {"output_tokens": a.output_tokens}}, "extra_headers": {"X-Agent": a.agent},
    }  # fmt: skip
    start = time.perf_counter()
    rec = Outcome(a.agent, start - t0, 0, 0.0)
    try:
        raw = await client.chat.completions.with_raw_response.create(stream=a.stream, **kwargs)
        rec.status, rec.degraded = raw.status_code, raw.headers.get("x-chimera-degraded")
        body = raw.parse()
        if a.stream:
            async for chunk in body:
                if rec.ttft_s is None and chunk.choices and chunk.choices[0].delta.content:
                    rec.ttft_s = time.perf_counter() - start
    except openai.APIStatusError as exc:
        rec.status, rec.retry_after = exc.status_code, exc.response.headers.get("retry-after")
        rec.error = type(exc).__name__
    except openai.APIError as exc:  # connection errors and timeouts: a hang or a broken gateway
        rec.error = type(exc).__name__
    rec.e2e_s = time.perf_counter() - start
    out.append(rec)


def meets_sla(o: Outcome, sla: Mapping[str, float]) -> bool:
    if o.status != 200:
        return False
    if "ttft_ms" in sla and (o.ttft_s if o.ttft_s is not None else o.e2e_s) * 1000 > sla["ttft_ms"]:
        return False
    return not ("e2e_ms" in sla and o.e2e_s * 1000 > sla["e2e_ms"])


def _p99_ms(xs: list[float]) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)] * 1000.0, 1)


def read_queue_waits(request_log: str | Path) -> dict[str, float]:
    """Per agent, the longest ``queue_wait_s`` in a gateway request log."""
    waits: dict[str, float] = {}
    for line in Path(request_log).read_text().splitlines():
        rec = json.loads(line)
        if rec.get("queue_wait_s") is not None and rec.get("agent"):
            waits[rec["agent"]] = max(waits.get(rec["agent"], 0.0), rec["queue_wait_s"])
    return waits


def summarize(s: Scenario, outcomes: list[Outcome], queue_waits: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Per agent: requests, SLA attainment, 429s (and how many said Retry-After), degraded, 5xx,
    other errors, the longest queue wait and the longest any 429 took, against the SLA deadline."""
    out: dict[str, Any] = {}
    for a in s.agents():
        mine = [o for o in outcomes if o.agent == a.agent]
        sla = sla_ms(s, a)
        rejected = [o for o in mine if o.status == 429]
        deadline_s = min(sla.values()) / 1000.0
        out[a.agent] = {
            "priority": a.priority, "on_overload": a.on_overload, "rate_rps": round(a.rate_rps, 2),
            "requests": len(mine), "ok": sum(o.status == 200 for o in mine),
            "sla_attainment": round(sum(meets_sla(o, sla) for o in mine) / len(mine), 4) if mine else None,
            "rejected_429": len(rejected), "retry_after_present": sum(o.retry_after is not None for o in rejected),
            "degraded": sum(o.degraded is not None for o in mine),
            "5xx": sum(o.status >= 500 for o in mine), "other_errors": sum(o.status == 0 for o in mine),
            "deadline_s": round(deadline_s, 3),
            "max_queue_wait_s": round((queue_waits or {}).get(a.agent, 0.0), 3),
            "max_429_latency_s": round(max((o.e2e_s for o in rejected), default=0.0), 3),
            "sla_met": sum(meets_sla(o, sla) for o in mine),
            "ttft_p99_ms": _p99_ms([o.ttft_s if o.ttft_s is not None else o.e2e_s for o in mine if o.status == 200]),
            "drain_ok": sum(o.status == 200 for o in mine if o.sent_at >= s.duration_s),
            "drain_requests": sum(o.sent_at >= s.duration_s for o in mine),
        }  # fmt: skip
    return out
