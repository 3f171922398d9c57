"""Small helpers shared by the raw-ASGI servers in backends/ (the simulated worker, the bench's
sim-field proxy) and the bench's zero-latency worker: they skip a framework to stay cheap."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or ``None`` if the client disconnected before sending it all."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
