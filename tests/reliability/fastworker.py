"""An in-process OpenAI-style worker behind ``httpx.MockTransport``: no sockets, microseconds per
answer, so fuzzing measures the gateway. Like vLLM it refuses what it cannot serve with a 400 in
OpenAI's envelope (the gateway passes a worker's 4xx through untouched)."""

from __future__ import annotations

import json
from typing import Any

import httpx2 as httpx


def _error(message: str) -> httpx.Response:
    env = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": None}}
    return httpx.Response(400, json=env)


async def handle(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if path == "/health":
        return httpx.Response(200, json={})
    if path == "/metrics":
        return httpx.Response(200, text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
    try:
        body: Any = json.loads(await request.aread())
    except ValueError:
        return _error("not JSON")
    if not isinstance(body, dict):
        return _error("not an object")
    chat = path.endswith("chat/completions")
    n = body.get("max_tokens")
    n = n if isinstance(n, int) and 0 < n <= 4 else 4
    model = body.get("model")
    if body.get("stream") is True:
        events = []
        for i in range(n):
            choice = {"index": 0, "delta": {"content": f"t{i} "}} if chat else {"index": 0, "text": f"t{i} "}
            events.append(b"data: " + json.dumps({"id": "c", "model": model, "choices": [choice]}).encode() + b"\n\n")
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
        events.append(b"data: " + json.dumps({"id": "c", "choices": [], "usage": usage}).encode() + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        return httpx.Response(200, content=b"".join(events), headers={"content-type": "text/event-stream"})
    text = "".join(f"t{i} " for i in range(n))
    choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
    usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
    return httpx.Response(200, json={"id": "c", "object": "x", "model": model, "choices": [choice], "usage": usage})


def fast_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handle))
