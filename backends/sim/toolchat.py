"""Chat completions answered with a script (tool calls, a JSON document): the body and the stream vLLM 0.26's
chat serving writes with the hermes parser (``vllm/entrypoints/openai/chat_completion/serving.py``).

Not streamed: ``message.tool_calls`` (``chatcmpl-tool-…`` ids), ``content`` null after Hermes calls and
``""`` for forced ones, ``finish_reason`` ``"tool_calls"`` — except a named function's (``"stop"``) and an
answer cut by ``max_tokens`` (``"length"``; a cut Hermes block parses to no calls and comes back as text).
Streamed: the role chunk, then one chunk per token that the parser turns into something (the first of a
call carries its id, type and name; the rest argument text, each with the call's ``index``), the last
chunk with the finish reason (``"tool_calls"`` once any call was streamed, a named function excepted).
Several answers (``n``) stream interleaved, as in :mod:`backends.sim.choices`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from backends.sim import api
from backends.sim.api import JSON_HEADERS, SSE_HEADERS, ChunkWriter, Completion
from backends.sim.drive import finished, running
from backends.sim.engine import Engine, Request, Status
from backends.sim.script import AUTO_MODE, NAMED_MODE, REQUIRED_MODE, Call, Script
from router.core.asgi import Receive, Send, respond


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"  # vLLM's make_tool_call_id()


async def complete(engine: Engine, model: str, req_id: str, c: Completion, scripts: Sequence[Script],
                   reqs: Sequence[Request], receive: Receive, send: Send) -> None:  # fmt: skip
    """Answer chat request ``c``: choice ``i`` is ``reqs[i]`` writing ``scripts[i]``."""
    async with running(engine, reqs, receive, c.stream):
        if c.stream:
            await _stream(model, req_id, c, scripts, reqs, send)
        elif await finished(reqs):
            choices = [_choice(i, s, r) for i, (s, r) in enumerate(zip(scripts, reqs, strict=True))]
            body = {
                "id": req_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": choices,
                "usage": api.usage(_prompt_tokens(c), sum(len(r.output) for r in reqs)),
            }
            await respond(send, 200, json.dumps(body, separators=(",", ":")).encode(), JSON_HEADERS)  # fmt: skip


def _prompt_tokens(c: Completion) -> int:
    return sum(len(ids) for _, ids in c.batch)


def finish_reason(script: Script, req: Request, calls: Sequence[Call]) -> str:
    """vLLM's non-streamed finish reason: ``"tool_calls"`` when Hermes calls parsed, or a ``"required"``
    answer ended by itself."""
    if script.mode == AUTO_MODE and calls:
        return "tool_calls"
    if script.mode == REQUIRED_MODE and req.finish_reason == "stop":
        return "tool_calls"
    return req.finish_reason


def _choice(index: int, script: Script, req: Request) -> dict[str, Any]:
    out = script.outcome(len(req.output))
    content = out.content
    if script.mode in (NAMED_MODE, REQUIRED_MODE):
        content = content or ""
    calls = [{"id": tool_call_id(), "type": "function", "function": {"name": k.name, "arguments": k.arguments}}
             for k in out.calls]  # fmt: skip
    message = {"role": "assistant", "content": content, "refusal": None, "tool_calls": calls,
               "reasoning_content": None}  # fmt: skip
    return {"index": index, "message": message, "logprobs": None,
            "finish_reason": finish_reason(script, req, out.calls), "stop_reason": None}  # fmt: skip


class _ChoiceStream:
    """One choice's chunks."""

    def __init__(self, req_id: str, model: str, index: int, script: Script, req: Request) -> None:
        self.head = {"id": req_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        self.index, self.script, self.req = index, script, req
        self.ids = [tool_call_id() for _ in script.calls]
        self.streamed_calls = False

    def chunks(self, start: int, stop: int) -> bytes:
        parts = []
        last = self.req.final_len - 1
        for k in range(start, stop):
            content, calls = self.script.delta(k, self.ids)
            if not calls and content is None and k != last:
                continue  # the parser holds the token back (a tag, JSON between arguments)
            delta: dict[str, Any] = {}
            if self.script.mode == AUTO_MODE and calls:
                delta["content"] = None  # the hermes parser names it, unset
            if content is not None:
                delta["content"] = content
            if calls:
                delta["tool_calls"] = calls
                self.streamed_calls = True
            choice: dict[str, Any] = {"index": self.index, "delta": delta, "logprobs": None, "finish_reason": None}
            if k == last:
                named = self.script.mode == NAMED_MODE
                choice["finish_reason"] = "tool_calls" if self.streamed_calls and not named else self.req.finish_reason
                choice["stop_reason"] = None
            parts.append(b"data: " + json.dumps({**self.head, "choices": [choice]}, separators=(",", ":")).encode()
                         + b"\n\n")  # fmt: skip
        return b"".join(parts)


async def _stream(model: str, req_id: str, c: Completion, scripts: Sequence[Script], reqs: Sequence[Request],
                  send: Send) -> None:  # fmt: skip
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    opening = b"".join(ChunkWriter(req_id, True, model, i).role_chunk() for i in range(len(reqs)))
    await send({"type": "http.response.body", "body": opening, "more_body": True})
    streams = [_ChoiceStream(req_id, model, i, s, r) for i, (s, r) in enumerate(zip(scripts, reqs, strict=True))]
    out: asyncio.Queue[bytes | None] = asyncio.Queue()
    feeders = [asyncio.create_task(_feed(s, out)) for s in streams]
    try:
        left = len(streams)
        while left:
            part = await out.get()
            if part is None:
                left -= 1
            else:
                await send({"type": "http.response.body", "body": part, "more_body": True})
        if any(r.status is Status.ABORTED for r in reqs):
            return
        w = ChunkWriter(req_id, True, model)
        tail = w.usage_chunk(_prompt_tokens(c), sum(len(r.output) for r in reqs)) if c.include_usage else b""
        await send({"type": "http.response.body", "body": tail + api.DONE, "more_body": False})
    finally:
        for f in feeders:
            f.cancel()


async def _feed(s: _ChoiceStream, out: asyncio.Queue[bytes | None]) -> None:
    try:
        async for start, stop in s.req.follow():
            if part := s.chunks(start, stop):
                out.put_nowait(part)
    finally:
        out.put_nowait(None)
