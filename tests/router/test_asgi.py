"""router.core.asgi and router.edge (the hot routes' header and body readers) and router.proxy.run_until_disconnect
(one task per request, cancelled when the client hangs up), on hand-made ASGI messages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from router.core.asgi import Message, Send, header_map
from router.core.errors import BodyTooLarge
from router.edge import request_body as read_body
from router.proxy import run_until_disconnect


def receiver(*messages: Message, then_wait: bool = True) -> Any:
    queue = list(messages)

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        if then_wait:
            await asyncio.Event().wait()  # nothing more, ever: as a client that keeps its connection
        return {"type": "http.disconnect"}

    return receive


def test_header_map_keeps_a_repeated_header_s_first_value() -> None:
    scope = {"headers": [(b"x-agent", b"a"), (b"content-length", b"3"), (b"x-agent", b"b"), (b"x-v", b"\xe9")]}
    assert header_map(scope) == {"x-agent": "a", "content-length": "3", "x-v": "é"}


async def test_read_body_joins_parts_within_the_limit() -> None:
    parts = receiver({"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.request", "body": b"c"})
    assert await read_body(parts, "3", 3) == b"abc"
    assert await read_body(receiver({"type": "http.request"}), None, 3) == b""


async def test_read_body_refuses_a_body_over_the_limit_declared_or_sent() -> None:
    with pytest.raises(BodyTooLarge, match="is 10 bytes"):
        await read_body(receiver(), "10", 3)
    more = {"type": "http.request", "body": b"ab", "more_body": True}
    parts = receiver(more, {"type": "http.request", "body": b"cd"})
    with pytest.raises(BodyTooLarge, match="exceeds"):
        await read_body(parts, None, 3)  # no content-length (a chunked body): counted as it comes


async def test_read_body_raises_client_disconnect_when_the_caller_hangs_up() -> None:
    with pytest.raises(ClientDisconnect):
        await read_body(receiver({"type": "http.request", "body": b"a", "more_body": True}, then_wait=False), None, 9)


def sink() -> tuple[list[Message], Send]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    return sent, send


async def test_work_that_completes_is_not_a_disconnect_even_when_uvicorn_says_so_after() -> None:
    sent, send = sink()
    done: list[str] = []

    async def work(tracked: Send) -> None:
        await tracked({"type": "http.response.body", "body": b"x", "more_body": False})
        await asyncio.sleep(0.01)  # bookkeeping after the last byte, while "disconnect" arrives
        done.append("bookkeeping")

    assert await run_until_disconnect(work, receiver(then_wait=False), send) is False
    assert done == ["bookkeeping"] and len(sent) == 1


async def test_a_disconnect_cancels_the_work_and_says_so() -> None:
    cancelled = asyncio.Event()

    async def work(tracked: Send) -> None:
        await tracked({"type": "http.response.body", "body": b"x", "more_body": True})
        try:
            await asyncio.sleep(10)  # waiting on the worker when the client leaves
        except asyncio.CancelledError:
            cancelled.set()
            raise

    disconnect = receiver({"type": "http.request", "body": b""}, then_wait=False)
    assert await asyncio.wait_for(run_until_disconnect(work, disconnect, sink()[1]), 2) is True
    assert cancelled.is_set()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the cancellation was consumed


async def test_errors_and_outside_cancellation_pass_through() -> None:
    async def fails(tracked: Send) -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await run_until_disconnect(fails, receiver(), sink()[1])

    async def waits(tracked: Send) -> None:
        await asyncio.sleep(10)

    outer = asyncio.ensure_future(run_until_disconnect(waits, receiver(), sink()[1]))
    await asyncio.sleep(0.01)
    outer.cancel()  # say, the server shutting down: not the client's disconnect
    with pytest.raises(asyncio.CancelledError):
        await outer


async def test_a_short_answer_never_starts_a_watcher() -> None:
    calls: list[str] = []

    async def receive() -> Message:
        calls.append("receive")
        return {"type": "http.disconnect"}

    async def work(tracked: Send) -> None:
        await tracked({"type": "http.response.body", "body": b"x", "more_body": False})

    assert await run_until_disconnect(work, receive, sink()[1], watch_after_s=0.05) is False
    await asyncio.sleep(0.1)
    assert calls == []
