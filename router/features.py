"""What the router reads from a request body: validation, model resolution and cheap features.

The body itself is forwarded unchanged; this module only looks at it. It never reads the
simulator-only ``sim`` field, and it never tokenizes: it gathers the prompt's text (message contents,
tool calls and results, the tools' and a response format's schemas) and counts its characters by kind
(:mod:`router.promptlen`), which the gateway prices at the rates calibrated for the served model.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.core.config import AUTO_MODEL, AgentConfig, Config
from router.core.errors import BadRequest, ModelNotAllowed, ModelNotFound, shown
from router.core.types import Endpoint, RequestFeatures
from router.promptlen import PromptCounts, prompt_counts

DEFAULT_OUTPUT_TOKENS = 512  # reserved for a request that names no max_tokens
COMPLETION_MAX_TOKENS = 16  # a completion without max_tokens: vLLM's (and OpenAI's) default


@dataclass(frozen=True, slots=True)
class ParsedBody:
    """The fields of an OpenAI request body the router uses."""

    model: str
    stream: bool
    max_tokens: int | None
    prompt: PromptCounts  # what the prompt is made of (router.promptlen)
    message_count: int
    sequences: int = 1  # answers generated: n x (the prompts of a batched completion)

    @property
    def prompt_tokens(self) -> int:
        """The prompt's tokens at the prior rates (the gateway's estimate uses the served model's)."""
        return self.prompt.tokens()


def parse_body(endpoint: Endpoint, body: Any) -> ParsedBody:
    """Validate the fields the router relies on (a worker validates the rest). Raises BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise BadRequest("you must provide a model parameter", param="model", code="missing_required_parameter")
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a non-empty string", param="model", code="invalid_type")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", param="stream", code="invalid_type")
    max_tokens = _max_tokens(body)
    n = body.get("n")
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise BadRequest("n must be a positive integer", param="n", code="invalid_type")
    texts: list[str] = []
    if endpoint == "completions":
        exact, count = _prompt_texts(body.get("prompt"), texts)
        prompt = prompt_counts(" ".join(texts), exact=exact)
        sequences = (n or 1) * count  # vLLM answers each prompt of the batch n times
    else:
        if endpoint == "chat":
            count, system = _message_texts(body.get("messages"), texts)
        else:
            count, system = _input_texts(body.get("input"), body.get("instructions"), texts)
        tools = _schema_texts(body, texts)
        prompt = prompt_counts(" ".join(texts), messages=count, tools=tools, system=system)
        sequences = (n or 1) if endpoint == "chat" else 1
    return ParsedBody(model, bool(stream), max_tokens, prompt, count, sequences)


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    # As vLLM reads it: max_completion_tokens wins over the older max_tokens (the Responses API's is
    # max_output_tokens). An integral float (256.0) is an integer, as JSON and vLLM's pydantic count it.
    value: int | None = None
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        v = body.get(key)
        if v is None:
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise BadRequest(f"{key} must be a positive integer", param=key, code="invalid_type")
        value = v
    return value


_SYSTEM_ROLES = ("system", "developer")


def _message_texts(messages: Any, texts: list[str]) -> tuple[int, bool]:
    """Append each chat message's text to ``texts``; the number of messages, and whether the first is the system's."""
    if messages is None:
        raise BadRequest("you must provide a messages parameter", param="messages", code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty array", param="messages", code="invalid_type")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a role", param=f"messages[{i}]",
                             code="invalid_type")  # fmt: skip
        _item_texts(m, texts)
    return len(messages), messages[0]["role"] in _SYSTEM_ROLES


def _schema_texts(body: Mapping[str, Any], texts: list[str]) -> bool:
    """Append what the chat template adds for ``tools`` and a ``response_format`` schema (the JSON the model
    reads, spaced as a template's ``tojson`` writes it); whether the request offers tools."""
    for key in ("tools", "response_format"):
        value = body.get(key)
        if value:
            texts.append(json.dumps(value, ensure_ascii=False))
    return bool(body.get("tools"))


def _item_texts(item: Mapping[str, Any], texts: list[str]) -> None:
    """Append the text of one Responses API input item (a message, a function call or its output) or chat
    message: its content, and a call's name and arguments."""
    content = item.get("content")
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, {"type": "image_url", ...}]
        texts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    for key in ("output", "arguments", "name"):  # function_call_output / function_call items
        value = item.get(key)
        if isinstance(value, str):
            texts.append(value)
    calls = item.get("tool_calls")  # an assistant message's calls: the template renders their arguments
    if isinstance(calls, list):
        texts.append(json.dumps(calls, ensure_ascii=False))


def _input_texts(input_: Any, instructions: Any, texts: list[str]) -> tuple[int, bool]:
    """The Responses API's prompt: ``instructions`` (a system message) and ``input`` (a string, or items);
    the number of messages, and whether the first is the system's."""
    count = 0
    if isinstance(instructions, str) and instructions:
        texts.append(instructions)
        count = 1
    if input_ is None:
        raise BadRequest("you must provide an input parameter", param="input", code="missing_required_parameter")
    if isinstance(input_, str):
        texts.append(input_)
        return count + 1, count == 1
    if not isinstance(input_, list) or not input_:
        raise BadRequest("input must be a string or a non-empty array of items", param="input", code="invalid_type")
    for i, item in enumerate(input_):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}] must be an object", param=f"input[{i}]", code="invalid_type")
        _item_texts(item, texts)
    return count + len(input_), count == 1 or input_[0].get("role") in _SYSTEM_ROLES


def _prompt_texts(prompt: Any, texts: list[str]) -> tuple[int, int]:
    """A completion's prompt: its text appended to ``texts``; the tokens given as ids, and the prompts."""
    if prompt is None:
        raise BadRequest("you must provide a prompt parameter", param="prompt", code="missing_required_parameter")
    if isinstance(prompt, str):
        texts.append(prompt)
        return 0, 1
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            texts.extend(prompt)
            return 0, len(prompt)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return len(prompt), 1
        if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
            return sum(len(p) for p in prompt), len(prompt)
    raise BadRequest("prompt must be a string, an array of strings or an array of token ids", param="prompt",
                     code="invalid_type")  # fmt: skip


def resolve_models(config: Config, agent: AgentConfig, requested: str) -> tuple[str, ...]:
    """The models a request may be served by: ``auto`` (or the agent's own name) means any the
    agent is allowed; a served model the agent may not use is 403; anything else 404."""
    if requested in (AUTO_MODEL, agent.name):
        return agent.models
    if requested in agent.models:
        return (requested,)
    if requested in config.served_models:
        raise ModelNotAllowed(f"agent {agent.name!r} may not use model {requested!r}", param="model")
    raise ModelNotFound(f"the model {shown(requested)} does not exist", param="model")


def _header_float(headers: Mapping[str, str], name: str) -> float | None:
    text = headers.get(name)
    if not text:  # the usual case, without the cost of a ValueError
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) and v > 0 else None


HEADER_INT_MAX = 1000  # x-priority, x-workflow-stage: beyond this no difference is meant (and none overflows)
WORKFLOW_ID = re.compile(r"[\x21-\x7e]{1,200}")  # x-workflow-id: visible ASCII, bounded (it is logged and kept)


def _header_int(headers: Mapping[str, str], name: str) -> int | None:
    text = headers.get(name)
    if not text:
        return None
    try:  # bounded: a 400-digit value parses, but the floats made of it later would overflow
        return min(HEADER_INT_MAX, max(0, int(text.strip())))
    except ValueError:
        return None


def _workflow_id(text: str | None) -> str | None:
    return text if text and WORKFLOW_ID.fullmatch(text) else None


def _tighter(asked: float | None, allowed: float | None) -> float | None:
    return allowed if asked is None else asked if allowed is None else min(asked, allowed)


def build_features(
    endpoint: Endpoint,
    agent: AgentConfig,
    models: tuple[str, ...],
    parsed: ParsedBody,
    headers: Mapping[str, str],
    seq: int,
    prompt_tokens: int | None = None,
) -> RequestFeatures:
    """Per-request features; SLA headers (``x-slo-ttft-ms``, ``x-slo-tpot-ms``, ``x-priority``)
    override the agent's defaults where they parse (and are ignored where they do not), within what
    the agent allows: a caller may tighten its SLA and lower its priority (a larger number), never
    loosen the SLA or rise above its agent's priority. ``prompt_tokens``: the gateway's calibrated
    estimate (:class:`router.promptlen.PromptLengths`); without it, the prior's."""
    priority = _header_int(headers, "x-priority")
    return RequestFeatures(
        agent=agent.name,
        endpoint=endpoint,
        models=models,
        prompt_tokens=parsed.prompt_tokens if prompt_tokens is None else prompt_tokens,
        max_tokens=parsed.max_tokens,
        stream=parsed.stream,
        message_count=parsed.message_count,
        sequences=parsed.sequences,
        seq=seq,
        priority=agent.priority if priority is None else max(agent.priority, priority),
        ttft_slo_ms=_tighter(_header_float(headers, "x-slo-ttft-ms"), agent.sla.ttft_ms),
        tpot_slo_ms=_tighter(_header_float(headers, "x-slo-tpot-ms"), agent.sla.tpot_ms),
        e2e_slo_ms=agent.sla.e2e_ms,
        min_quality=agent.min_quality,
        workflow_id=_workflow_id(headers.get("x-workflow-id")),
        workflow_stage=_header_int(headers, "x-workflow-stage"),
    )


def prefill_tokens(features: RequestFeatures, backend: str) -> int:
    """The prompt tokens ``backend`` has yet to prefill for a request: its prompt less the share the prefix
    index expects in that worker's cache; 0 for a non-streamed request (no first token marks its prefill's
    end, so it would look pending until its whole answer came)."""
    if not features.stream:
        return 0
    hit = features.prefix_hits.get(backend, 0.0) if features.prefix_hits else 0.0
    return round(features.prompt_tokens * (1.0 - min(1.0, max(0.0, hit))))


def reserved_tokens(features: RequestFeatures, predicted_output: float | None = None) -> int:
    """KV tokens a dispatched request claims: its prompt plus its output cap (or a default), or,
    where the policy predicted the output's length, that prediction (never above the cap), once per
    answer it asks for (``n``, and each prompt of a batched completion)."""
    limit = features.max_tokens or (COMPLETION_MAX_TOKENS if features.endpoint == "completions" else None)
    cap = limit or DEFAULT_OUTPUT_TOKENS
    if predicted_output is not None and predicted_output > 0:
        cap = min(cap, math.ceil(predicted_output)) if limit else math.ceil(predicted_output)
    return features.prompt_tokens + features.sequences * cap
