"""A tiny OpenAI-style worker for the faults a real worker cannot be made to produce on cue.

``FakeWorker(mode=...)`` is a plain ASGI app that records what it received and whether the
gateway abandoned the request (it watches for ``http.disconnect``):

    ok           answers like vLLM (JSON, or SSE chunk by chunk with ``chunk_delay`` between)
    status       answers ``status`` (e.g. 500 or 400) with an OpenAI error envelope
    garbage      200 with a body that is not JSON
    stall        reads the request, then never answers (until the gateway hangs up)
    stall_mid    streams ``break_after`` chunks, then goes silent
    die_mid      streams ``break_after`` chunks, then drops the connection
    end_mid      streams ``break_after`` chunks, then ends the response cleanly, without ``data: [DONE]``
    half_mid     streams ``break_after`` chunks and half an event, then ends cleanly
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class WorkerDied(Exception):
    """Raised inside the app after the response started: uvicorn then drops the connection."""


@dataclass
class FakeWorker:
    model: str = "fake-model"
    mode: str = "ok"
    status: int = 500
    chunks: int = 5
    chunk_delay: float = 0.0
    break_after: int = 2
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    abandoned: threading.Event = field(default_factory=threading.Event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path == "/health":
            await _respond(send, 200, b"{}")
            return
        if path == "/metrics":
            text = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.0\n"
            await _respond(send, 200, text, b"text/plain")
            return
        if scope["method"] != "POST":  # e.g. the prober's GET /v1/models: like a server that is not vLLM
            await _respond(send, 404, b'{"error": {"message": "not found"}}')
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        self.received.append(json.loads(body))
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self._answer(json.loads(body), path.endswith("chat/completions"), receive, send)

    async def _answer(self, req: dict[str, Any], chat: bool, receive: Receive, send: Send) -> None:
        if self.mode == "status":
            env = {"error": {"message": f"fake {self.status}", "type": "fake", "param": None, "code": None}}
            await _respond(send, self.status, json.dumps(env).encode())
        elif self.mode == "garbage":
            await _respond(send, 200, b"<html>not json")
        elif self.mode == "stall":
            await self._wait_abandoned(receive)
        elif req.get("stream"):
            await self._stream(req, chat, receive, send)
        else:
            n = min(self.chunks, req.get("max_tokens") or self.chunks)
            await asyncio.sleep(self.chunk_delay * n)
            await _respond(send, 200, json.dumps(_completion(self.model, chat, n)).encode())

    async def _wait_abandoned(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.abandoned.set()

    async def _stream(self, req: dict[str, Any], chat: bool, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        watcher = asyncio.ensure_future(self._wait_abandoned(receive))
        try:
            n = min(self.chunks, req.get("max_tokens") or self.chunks)
            for i in range(n):
                if i == self.break_after and self.mode == "stall_mid":
                    await watcher  # silent until the gateway gives up on us
                    return
                if i == self.break_after and self.mode == "die_mid":
                    raise WorkerDied
                if i == self.break_after and self.mode in ("end_mid", "half_mid"):
                    tail = b'data: {"id": "x", "object": "chu' if self.mode == "half_mid" else b""
                    await send({"type": "http.response.body", "body": tail, "more_body": False})
                    return
                if watcher.done():
                    return
                delta = {"content": f"w{i} "} if chat else None
                choice = {"index": 0, "delta": delta} if chat else {"index": 0, "text": f"w{i} "}
                await _event(send, {"id": "x", "object": "chunk", "model": self.model, "choices": [choice]})
                await asyncio.sleep(self.chunk_delay)
            if (req.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
                await _event(send, {"id": "x", "object": "chunk", "model": self.model, "choices": [], "usage": usage})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        finally:
            if not watcher.done():
                watcher.cancel()


def _completion(model: str, chat: bool, n: int) -> dict[str, Any]:
    text = "".join(f"w{i} " for i in range(n))
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": "fake-1", "object": "chat.completion" if chat else "text_completion", "created": 0, "model": model,
        "choices": [choice], "usage": {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n},
    }  # fmt: skip


async def _event(send: Send, data: dict[str, Any]) -> None:
    await send({"type": "http.response.body", "body": b"data: " + json.dumps(data).encode() + b"\n\n",
                "more_body": True})  # fmt: skip


async def _respond(send: Send, status: int, body: bytes, ctype: bytes = b"application/json") -> None:
    headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
