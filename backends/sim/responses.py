"""``POST /v1/responses`` as vLLM 0.26 serves it (``vllm/entrypoints/openai/responses/``), for a model that is
not gpt-oss: the input items become chat messages (``instructions`` a system message first; a string input
one user message; ``function_call`` items an assistant turn's tool calls, ``function_call_output`` items tool
messages), the prompt is their chat text, and the answer is drawn and run as a chat completion's is.

No response store, as vLLM without ``VLLM_ENABLE_RESPONSES_API_STORE``: ``store`` is accepted and ignored,
a ``previous_response_id`` (and ``GET /v1/responses/{id}``) is a 404 "Response with id '…' not found.",
``background`` a 400. The body is the response object (``status`` ``"completed"``, or ``"incomplete"`` with
``incomplete_details.reason`` ``"max_output_tokens"`` when the answer was cut); a stream is
:mod:`backends.sim.responses_stream`'s events.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backends.sim import api
from backends.sim.api import Completion, _bool, _opt_int, _random_sampling
from backends.sim.engine import Request
from backends.sim.errors import VllmError, invalid_field, json_object, rejected
from backends.sim.script import Call, Script
from backends.sim.textgen import Tokenizer, chat_text, render
from backends.sim.toolchat import tool_call_id
from backends.sim.tools import NAMED, REQUIRED, Structure, parse_responses, tools_prompt
from router.core.errors import SimApiError

#: (request id, draw key, prompt ids, natural length or None to draw one) -> an engine request
MakeRequest = Callable[[str, str, list[int], int | None], Request]
ROLES = ("user", "assistant", "system", "developer")


@dataclass(frozen=True)
class ResponsesCall:
    completion: Completion  # what the engine runs
    response_id: str
    echo: dict[str, Any]  # the request's settings as the response object repeats them


def not_found(response_id: str) -> VllmError:
    return VllmError(404, f"Response with id '{response_id}' not found.", "response_id", "invalid_request_error")


def parse(body: bytes, served_model: str, max_model_len: int, tokenizer: Tokenizer) -> ResponsesCall:
    """Check a Responses request as vLLM does, in its order; raises :class:`SimApiError`."""
    req = json_object(body)
    if req.get("background") and req.get("store") is False:
        raise rejected("background can only be used when `store` is true", "background")
    if req.get("prompt") is not None:
        raise rejected("prompt template is not supported", "prompt")
    if "input" not in req:
        raise invalid_field(("input",), "Field required", req, "missing")
    messages = _messages(req.get("instructions"), req["input"])
    structure, tools = parse_responses(req, bool(messages) and messages[-1].get("role") == "user")
    model = req.get("model") or served_model
    if model != served_model:
        raise SimApiError(404, f"The model `{model}` does not exist.", "model")
    if req.get("background") and req.get("store", True) is not False:
        raise VllmError(
            400,
            "This vLLM engine does not support `store=True` and therefore does not support the background mode. "
            "To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when "
            "launching the vLLM server.",
            "background",
            "invalid_request_error",
        )
    previous = req.get("previous_response_id")
    if previous is not None:
        raise not_found(str(previous))  # nothing is ever stored
    text = chat_text(messages)
    if tools:
        text = f"{tools_prompt(tools)} {text}"
    ids = tokenizer.encode_chat(text)
    if not ids:
        raise SimApiError(400, "The prompt cannot be empty", "input")
    max_tokens = _max_tokens(_opt_int(req, "max_output_tokens", None), len(ids), max_model_len)
    output_tokens, difficulty = api.sim_fields(req)
    temperature = req.get("temperature")
    c = Completion(
        chat=True, stream=_bool(req, "stream"), include_usage=False, prompt_text=text, prompt_ids=ids,
        max_tokens=max_tokens, min_tokens=0, ignore_eos=_bool(req, "ignore_eos"), output_tokens=output_tokens,
        difficulty=difficulty, seed=_opt_int(req, "seed", None), random_sampling=_random_sampling(temperature),
        priority=_opt_int(req, "priority", 0) or 0, batch=((text, ids),), structure=structure,
    )  # fmt: skip
    rid = req.get("request_id")
    response_id = rid if isinstance(rid, str) and rid else f"resp_{uuid.uuid4().hex}"
    return ResponsesCall(c, response_id, _echo(req, structure, max_tokens, temperature))


def _max_tokens(asked: int | None, prompt_len: int, max_model_len: int) -> int:
    """The renderer's length check, then the serving's, then vLLM's ``get_max_tokens``."""
    if prompt_len > max_model_len - (asked or 0):
        raise SimApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested {asked or 0} "
            f"output tokens and your prompt contains {prompt_len} input tokens, for a total of "
            f"{prompt_len + (asked or 0)} tokens. Please reduce the length of the input prompt or the number of "
            "requested output tokens.",
            "input_tokens",
        )
    if prompt_len >= max_model_len:
        raise VllmError(400, f"The engine prompt length {prompt_len} exceeds the max_model_len {max_model_len}. "
                        "Please reduce prompt.", "input", "invalid_request_error")  # fmt: skip
    room = max_model_len - prompt_len
    max_tokens = room if asked is None else min(asked, room)
    if max_tokens < 1:
        raise SimApiError(400, f"max_tokens must be at least 1, got {max_tokens}.", "max_output_tokens")
    return max_tokens


def _messages(instructions: object, items: object) -> list[dict[str, Any]]:
    """vLLM's ``construct_input_messages``: the chat messages the input items stand for."""
    if instructions is not None and not isinstance(instructions, str):
        raise invalid_field(("instructions",), "Input should be a valid string", instructions, "string_type")
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise invalid_field(("input",), "Input should be a valid string or list", items, "union_type")
    for i, item in enumerate(items):
        msg = _message(item, i)
        prev = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
        if prev is not None and msg["role"] == "assistant" and "tool_calls" in msg:
            prev.setdefault("tool_calls", []).extend(msg["tool_calls"])  # a turn's calls join its message
        elif prev is not None and msg["role"] == "assistant" and prev.get("content") is None and msg.get("content"):
            prev["content"] = msg["content"]  # the text of a turn that called tools
        else:
            messages.append(msg)
    return messages


def _message(item: object, i: int) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise invalid_field(("input", i), "Input should be a valid dictionary", item, "model_type")
    kind = item.get("type", "message")
    if kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise invalid_field(("input", i, "function_call", key), "Field required", item, "missing")
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}  # fmt: skip
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str) or "output" not in item:
            raise invalid_field(("input", i, "function_call_output"), "Field required", item, "missing")
        return {"role": "tool", "content": _text(item["output"]), "tool_call_id": item["call_id"]}
    if kind == "reasoning":
        return {"role": "assistant", "reasoning": item.get("content")}  # not in the prompt of a non-reasoning model
    if kind != "message" or item.get("role") not in ROLES:
        raise invalid_field(("input", i), "Input should be a valid input item", item, "union_tag_invalid")
    content = item.get("content")
    if not isinstance(content, str | list):
        raise invalid_field(("input", i, "content"), "Input should be a valid string or list", content, "union_type")
    return {"role": item["role"], "content": content}


def _text(output: object) -> str:
    """A function call's output: a string, or content parts (their text)."""
    if isinstance(output, list):
        return " ".join(p["text"] for p in output if isinstance(p, dict) and isinstance(p.get("text"), str))
    return output if isinstance(output, str) else json.dumps(output)


def _echo(req: dict[str, Any], s: Structure, max_tokens: int, temperature: object) -> dict[str, Any]:
    """``ResponsesResponse.from_request``: the request's settings, as sampled, in the response object."""
    tools = [{"name": None, "parameters": None, "strict": None, "type": "function", "description": None, **t}
             if t.get("type") == "function" else t for t in req.get("tools") or []]  # fmt: skip
    text = req.get("text")
    if s.choice in (REQUIRED, NAMED):  # vLLM swaps in the guided-decoding schema of the forced call
        schema = s.tool(s.named).parameters if s.choice == NAMED else _required_schema(s)
        text = {"format": {"type": "json_schema", "name": "tool_calling_response", "schema": schema,
                           "description": None, "strict": True}}  # fmt: skip
    choice = req.get("tool_choice", "auto") if s.tools or req.get("tools") else "none"
    parallel = req.get("parallel_tool_calls")
    return {
        "instructions": req.get("instructions"), "metadata": req.get("metadata"),
        "parallel_tool_calls": True if parallel is None else parallel,
        "temperature": 1.0 if temperature is None else temperature,
        "tool_choice": choice, "tools": tools, "top_p": 1.0 if req.get("top_p") is None else req["top_p"],
        "background": bool(req.get("background")), "max_output_tokens": max_tokens,
        "max_tool_calls": req.get("max_tool_calls"), "previous_response_id": None, "prompt": None,
        "reasoning": req.get("reasoning"), "service_tier": req.get("service_tier") or "auto",
        "text": text, "top_logprobs": None, "truncation": req.get("truncation") or "disabled",
        "user": req.get("user"),
        "presence_penalty": req.get("presence_penalty") or 0.0,
        "frequency_penalty": req.get("frequency_penalty") or 0.0,
        "kv_transfer_params": None, "ec_transfer_params": None, "input_messages": None, "output_messages": None,
    }  # fmt: skip


def _required_schema(s: Structure) -> dict[str, Any]:
    """vLLM's guided-decoding schema for ``tool_choice: "required"``: a list of one or more calls."""
    calls = [{"properties": {"name": {"type": "string", "enum": [t.name]},
                             "parameters": t.parameters or {"type": "object", "properties": {}}},
              "required": ["name", "parameters"]} for t in s.tools]  # fmt: skip
    return {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}}


def response_object(call: ResponsesCall, model: str, created: int, status: str, output: list[dict[str, Any]],
                    usage: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {"id": call.response_id, "created_at": created, "incomplete_details": incomplete, "model": model,
            "object": "response", "output": output, "status": status, "usage": usage, **call.echo}  # fmt: skip


def usage(req: Request) -> dict[str, Any]:
    n = len(req.output)
    return {
        "input_tokens": req.prompt_len,
        "input_tokens_details": {"cached_tokens": req.cached_tokens, "input_tokens_per_turn": [],
                                 "cached_tokens_per_turn": []},
        "output_tokens": n,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [],
                                  "tool_output_tokens_per_turn": []},
        "total_tokens": req.prompt_len + n,
    }  # fmt: skip


def output_items(script: Script | None, req: Request) -> list[dict[str, Any]]:
    """vLLM's ``build_response_output_items``: a message for the text (when there is some), then one
    ``function_call`` item per parsed call."""
    calls: tuple[Call, ...] = ()
    if script is None:
        content: str | None = render(req.output)
    else:
        out = script.outcome(len(req.output))
        content, calls = out.content, out.calls
    items: list[dict[str, Any]] = []
    if content:
        part: dict[str, Any] = {"annotations": [], "text": content, "type": "output_text", "logprobs": None}
        items.append({"id": f"msg_{uuid.uuid4().hex}", "content": [part], "role": "assistant",
                      "status": "completed", "type": "message"})  # fmt: skip
    for k in calls:
        items.append({"arguments": k.arguments, "call_id": tool_call_id(), "name": k.name, "type": "function_call",
                      "id": f"fc_{uuid.uuid4().hex}", "namespace": None, "status": "completed"})  # fmt: skip
    return items


def status(req: Request) -> str:
    return "incomplete" if req.finish_reason == "length" else "completed"


def final(call: ResponsesCall, model: str, created: int, script: Script | None, req: Request) -> dict[str, Any]:
    """The finished response object."""
    return response_object(call, model, created, status(req), output_items(script, req), usage(req))
