"""Per-agent rate limits (``rpm``, ``tpm`` in the agent's config) as token buckets.

The buckets live in the fleet state (its :class:`RateBuckets`): in this process for ``memory``, in Redis for
every replica at once (one Lua call per request). A request costs one request and its reserved
tokens — the prompt estimate plus ``max_tokens`` (or the default reservation), as OpenAI counts
``max_tokens`` against a token limit. Over the limit: 429 with the seconds until the buckets hold
enough as ``Retry-After``. A request that admission then turns away (429 ``overloaded``, ``queue_full``,
``queue_timeout``) gets its take back (:func:`refund_rate_limits`): a client that honours Retry-After
must not find its minute spent by requests that were never served.
"""

from __future__ import annotations

import math

from router.core.config import AgentConfig
from router.core.errors import BadRequest, ModelNotAllowed, ModelNotFound, Overloaded
from router.core.types import RequestFeatures
from router.features import reserved_tokens
from router.gateway import Gateway
from router.requestlog import RequestRecord
from router.state.base import RateBuckets


async def enforce_rate_limits(
    gw: Gateway, agent: AgentConfig, features: RequestFeatures, record: RequestRecord | None = None
) -> None:
    """Take this request from the agent's buckets, or raise Overloaded."""
    await charge(gw, agent, reserved_tokens(features), record)


async def charge(gw: Gateway, agent: AgentConfig, tokens: int, record: RequestRecord | None = None) -> None:
    """Take one request and ``tokens`` from the agent's buckets, or raise Overloaded: the one path of every request
    that reaches a worker (completions, embeddings, tokenize) and of the ones refused for what they sent (400, 403,
    404 cost a request of ``rpm``, so a caller cannot probe or flood for free)."""
    if agent.rpm is None and agent.tpm is None:
        return
    wait = await gw.state.take_tokens(agent.name, 1, tokens, agent.rpm, agent.tpm)
    if wait > 0:
        limits = ", ".join(f"{k} {v}" for k, v in (("rpm", agent.rpm), ("tpm", agent.tpm)) if v is not None)
        _over(gw, agent, f"agent {agent.name!r} is over its rate limit ({limits})", wait, record)


async def charge_feedback(gw: Gateway, agent: AgentConfig) -> None:
    """Take one verdict from the agent's feedback bucket (``rpm`` verdicts a minute, apart from its requests': a
    verdict per answer costs none of its serving), or raise Overloaded."""
    if agent.rpm is None:
        return
    wait = await gw.state.take_tokens(f"{agent.name}/feedback", 1, 0, agent.rpm, None)  # "/": in no agent's name
    if wait > 0:
        _over(gw, agent, f"agent {agent.name!r} is over its feedback limit (rpm {agent.rpm})", wait)


def _over(gw: Gateway, agent: AgentConfig, what: str, wait: float, record: RequestRecord | None = None) -> None:
    gw.metrics.rejections.labels(agent.name, "rate_limit").inc()
    if record is not None:
        record.error = "Overloaded"
    raise Overloaded(f"{what}; retry after {wait:.1f} s", retry_after_s=math.ceil(wait), code="rate_limit_exceeded")


async def refund_rate_limits(gw: Gateway, features: RequestFeatures) -> None:
    """Give back what :func:`enforce_rate_limits` took for a request that was not served (a negative take:
    the buckets refill by it, never above a minute's allowance)."""
    agent = gw.config.agent(features.agent)
    if agent is None or (agent.rpm is None and agent.tpm is None):
        return
    await _take(gw.state, agent, features, -1)


async def _take(buckets: RateBuckets, agent: AgentConfig, features: RequestFeatures, sign: int) -> float:
    """Take (``sign`` 1) or give back (-1) one request and its reserved tokens; the seconds to wait, or 0."""
    return await buckets.take_tokens(agent.name, sign, sign * reserved_tokens(features), agent.rpm, agent.tpm)


#: What a request is refused for when it is the caller's own doing (its body, its model): it still costs one request.
REFUSED = (BadRequest, ModelNotFound, ModelNotAllowed)


async def charge_refused(gw: Gateway, caller: AgentConfig | None, record: RequestRecord | None = None) -> None:
    """One request of ``caller``'s ``rpm`` (``gateway.default_agent``'s where none is known yet) for a request refused
    as :data:`REFUSED`; Overloaded (429) instead where none is left."""
    caller = caller or gw.agents.default
    if caller is not None:
        await charge(gw, caller, 0, record)
