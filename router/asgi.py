"""ASGI-level helpers for the gateway's hot routes, which skip Starlette's Request object.

A completion is the gateway's whole reason to exist and runs a thousand times a second, so its
endpoint reads the scope and ``receive`` directly: the headers once into a dict, the body with
its size limit. Errors still leave through the app's one exception handler (``router.app``).
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope

import backends.asgi
from router.errors import BodyTooLarge


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


async def read_body(receive: Receive, content_length: str | None, limit: int) -> bytes:
    """The request body, or BodyTooLarge as soon as it is known to exceed ``limit`` bytes.
    ClientDisconnect if the caller hangs up before sending all of it."""
    if content_length and content_length.isdigit() and int(content_length) > limit:
        raise BodyTooLarge(f"the request body is {content_length} bytes; the limit is {limit}")
    try:
        body = await backends.asgi.read_body(receive, limit)
    except backends.asgi.BodyTooLong:
        raise BodyTooLarge(f"the request body exceeds the limit of {limit} bytes") from None
    if body is None:
        raise ClientDisconnect()
    return body
