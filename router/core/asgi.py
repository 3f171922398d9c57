"""The ASGI types every raw-ASGI server here shares, and the one body reader.

The gateway's hot routes, the simulated worker and the bench's zero-latency worker read the scope
and ``receive`` directly instead of building a framework request: a completion runs a thousand
times a second, and the workers must stay cheap. The types are Starlette's (``starlette.types``),
named once here so that no module redefines them.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.core.errors import BodyTooLarge

__all__ = ["ASGIApp", "Message", "Receive", "Scope", "Send", "header_map", "read_body", "respond", "route_path"]


async def read_body(receive: Receive, limit: int | None = None, *, content_length: str | None = None) -> bytes | None:
    """The whole request body, or ``None`` if the client disconnected before sending it all.

    :class:`BodyTooLarge` as soon as the body is known to exceed ``limit`` bytes (when given): from a
    ``content_length`` header that says so, before a byte is read, or as the chunks arrive.
    """
    if limit is not None and content_length and content_length.isdigit() and int(content_length) > limit:
        raise BodyTooLarge(f"the request body is {content_length} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise BodyTooLarge(f"the request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """A whole answer: status, ``headers`` and its content-length, then ``body``."""
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body, "more_body": False})


def route_path(scope: Scope) -> str:
    """The request's path below the app's mount point: ``scope["path"]`` less a ``root_path`` that
    prefixes it (uvicorn ``--root-path`` puts it in both), as Starlette's router matches routes."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    rest = path[len(root) :]
    return rest if not rest or rest[0] == "/" else path


def header_map(scope: Scope) -> dict[str, str]:
    """The request's headers by (lowercase) name; where a name repeats, its first value, as
    ``starlette.datastructures.Headers.get`` answers."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(scope["headers"])}
