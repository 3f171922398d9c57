"""Requests that ask for several answers: ``n`` > 1, or a batch of prompts to ``/v1/completions``.

vLLM V1 fans such a request out into one engine request per answer (its ``ParentRequest``), each
scheduled on its own (the prompt's blocks shared through the prefix cache), and gathers them into one
response: choice ``i`` of prompt ``p`` has index ``p * n + i``; ``usage.prompt_tokens`` counts each
prompt once and ``completion_tokens`` every answer's. Streamed, each choice opens with its own role
chunk (chat) and its tokens come as they are generated, choices interleaved; the usage chunk and
``[DONE]`` follow the last one. The single-answer path in :mod:`backends.sim.server` stays as it is
(one template per stream, no gathering).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from backends.sim import api
from backends.sim.api import JSON_HEADERS, SSE_HEADERS, ChunkWriter, Completion
from backends.sim.engine import Engine, Request, Status
from backends.sim.textgen import VOCAB
from router.core.asgi import Receive, Send, respond

MakeRequest = Callable[[str, str, list[int]], Request]  # (request id, draw key, prompt ids) -> a request


def fan_out(c: Completion, req_id: str, make: MakeRequest) -> list[Request]:
    """One engine request per answer, in choice order. The first answer to a prompt is drawn as a
    single request's would be; answer ``i`` > 0 on a key of its own (so the answers differ)."""
    return [make(f"{req_id}-{p * c.n + i}", api.answer_key(c, text, i), ids)
            for p, (text, ids) in enumerate(c.batch) for i in range(c.n)]  # fmt: skip


async def complete_many(engine: Engine, model: str, c: Completion, make: MakeRequest, receive: Receive,
                        send: Send) -> None:  # fmt: skip
    """Answer ``c`` (``c.choices`` > 1) with one engine request per choice."""
    req_id = api.new_id(c.chat, c.request_id)
    reqs = fan_out(c, req_id, make)
    for r in reqs:
        r.notify_each = c.stream
    watcher = asyncio.create_task(abort_on_disconnect(engine, reqs, receive))
    for r in reqs:
        engine.submit(r)
    try:
        if c.stream:
            await _stream(reqs, req_id, model, c, send)
            return
        for r in reqs:
            while not r.done:
                await r.wait_for_output(len(r.output))
        if all(r.status is Status.FINISHED for r in reqs):
            answers = [(" ".join(VOCAB[k] for k in r.output), r.finish_reason) for r in reqs]
            body = api.full_response_many(req_id, c.chat, model, answers, _prompt_tokens(c),
                                          sum(len(r.output) for r in reqs))  # fmt: skip
            await respond(send, 200, body, JSON_HEADERS)
    finally:
        watcher.cancel()
        for r in reqs:
            engine.abort(r)  # no-ops unless the handler itself was cancelled


def _prompt_tokens(c: Completion) -> int:
    return sum(len(ids) for _, ids in c.batch)


async def abort_on_disconnect(engine: Engine, reqs: list[Request], receive: Receive) -> None:
    """Abort ``reqs`` once their client hangs up (a task beside the handler's)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    for r in reqs:
        engine.abort(r)


async def _stream(reqs: list[Request], req_id: str, model: str, c: Completion, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    writers = [ChunkWriter(req_id, c.chat, model, index) for index in range(len(reqs))]
    if c.chat:
        opening = b"".join(w.role_chunk() for w in writers)
        await send({"type": "http.response.body", "body": opening, "more_body": True})
    out: asyncio.Queue[bytes | None] = asyncio.Queue()
    feeders = [asyncio.create_task(_feed(r, w, out)) for r, w in zip(reqs, writers, strict=True)]
    try:
        left = len(reqs)
        while left:
            part = await out.get()
            if part is None:
                left -= 1
                continue
            await send({"type": "http.response.body", "body": part, "more_body": True})
        if any(r.status is Status.ABORTED for r in reqs):
            return
        tail = writers[0].usage_chunk(_prompt_tokens(c), sum(len(r.output) for r in reqs)) if c.include_usage else b""
        await send({"type": "http.response.body", "body": tail + api.DONE, "more_body": False})
    finally:
        for f in feeders:
            f.cancel()


async def _feed(r: Request, w: ChunkWriter, out: asyncio.Queue[bytes | None]) -> None:
    """One choice's chunks onto ``out`` as its tokens come; then None."""
    try:
        async for start, stop in r.follow():
            finish = r.finish_reason if stop >= r.final_len else None
            parts = w.token_chunks(r.output, start, stop, finish)
            if parts:
                out.put_nowait(b"".join(parts))
    finally:
        out.put_nowait(None)
