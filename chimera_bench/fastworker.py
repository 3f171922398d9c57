"""A zero-latency OpenAI-compatible worker (raw ASGI): the bench's yardstick for gateway overhead.

Answers ``/v1/chat/completions`` and ``/v1/completions`` at once with a fixed answer of
``TOKENS`` words (streamed as one SSE chunk per word, all in one ``send``, or as one JSON body),
plus ``/health``, ``/v1/models`` and a ``/metrics`` with vLLM's gauges at zero so the gateway's
prober is happy. No framework: whatever the gateway adds over this is the gateway's own cost.

    python -m chimera_bench.fastworker --port P [--model NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable, Sequence

import uvicorn

from router.core.asgi import Receive, Scope, Send, read_body

TOKENS = 8


def _bodies(model: str) -> dict[str, bytes]:
    words = [f"w{i}" for i in range(TOKENS)]
    usage = {"prompt_tokens": 16, "completion_tokens": TOKENS, "total_tokens": 16 + TOKENS}
    out: dict[str, bytes] = {}
    for chat in (True, False):
        obj = "chat.completion" if chat else "text_completion"
        text = " ".join(words)
        choice = {"index": 0, "finish_reason": "stop",
                  **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}  # fmt: skip
        full = {"id": "fast-1", "object": obj, "created": 0, "model": model, "choices": [choice], "usage": usage}
        chunks = []
        for i, w in enumerate(words):
            piece = w if i == 0 else " " + w
            delta = {"delta": {"content": piece}} if chat else {"text": piece}
            fin = "stop" if i == TOKENS - 1 else None
            chunk = {"id": "fast-1", "object": obj + ".chunk" if chat else obj, "created": 0, "model": model,
                     "choices": [{"index": 0, **delta, "finish_reason": fin}]}  # fmt: skip
            chunks.append(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
        tail = {"id": "fast-1", "object": obj, "created": 0, "model": model, "choices": [], "usage": usage}
        chunks.append(b"data: " + json.dumps(tail, separators=(",", ":")).encode() + b"\n\n")
        key = "chat" if chat else "text"
        out[key] = json.dumps(full).encode()
        out[key + "_sse"] = b"".join(chunks) + b"data: [DONE]\n\n"
    listing = {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "fast"}]}
    out["models"] = json.dumps(listing).encode()
    out["metrics"] = (
        f'vllm:num_requests_running{{model_name="{model}"}} 0.0\n'
        f'vllm:num_requests_waiting{{model_name="{model}"}} 0.0\n'
        f'vllm:kv_cache_usage_perc{{model_name="{model}"}} 0.0\n'
    ).encode()
    return out


def create_app(model: str = "fast") -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    bodies = _bodies(model)
    json_h = [(b"content-type", b"application/json")]
    sse_h = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]

    async def reply(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if scope["method"] == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            body = await read_body(receive)
            if body is None:
                return  # the client left before its request was complete
            key = "chat" if path.endswith("chat/completions") else "text"
            try:
                stream = json.loads(body).get("stream") is True
            except (ValueError, AttributeError):
                await reply(send, 400, json_h, b'{"error": {"message": "bad JSON", "type": "BadRequestError"}}')
                return
            if stream:
                await reply(send, 200, sse_h, bodies[key + "_sse"])
            else:
                await reply(send, 200, json_h, bodies[key])
        elif path == "/health":
            await reply(send, 200, [], b"")
        elif path == "/v1/models":
            await reply(send, 200, json_h, bodies["models"])
        elif path == "/metrics":
            await reply(send, 200, [(b"content-type", b"text/plain; version=0.0.4")], bodies["metrics"])
        else:
            await reply(send, 404, json_h, b'{"error": {"message": "not found", "type": "NotFoundError"}}')

    return app


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chimera_bench.fastworker")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="fast")
    args = p.parse_args(argv)
    uvicorn.run(create_app(args.model), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
