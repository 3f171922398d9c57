"""Small helpers shared by the raw-ASGI servers in backends/ (the simulated worker, the bench's
sim-field proxy) and the bench's zero-latency worker: they skip a framework to stay cheap."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BodyTooLong(Exception):
    """The body grew past the limit the caller gave :func:`read_body`."""


async def read_body(receive: Receive, limit: int | None = None) -> bytes | None:
    """The whole request body, or ``None`` if the client disconnected before sending it all;
    :class:`BodyTooLong` as soon as it exceeds ``limit`` bytes (when given)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise BodyTooLong(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """A whole answer: status, ``headers`` and its content-length, then ``body``."""
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body, "more_body": False})
