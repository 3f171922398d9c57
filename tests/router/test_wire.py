"""router.wire on a real uvicorn server: a response's head goes out with its first body bytes in one
write; a head with nothing after it in the same pass of the loop is not held back; bytes keep their
order. Writes are counted on the real transport (what the client cannot see on loopback)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx2 as httpx
import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router.wire import HeadFirstProtocol
from tests.conftest import ServerThread

WRITES: list[bytes] = []


class _Counting:
    def __init__(self, transport: asyncio.Transport) -> None:
        self._t = transport

    def write(self, data: bytes) -> None:
        WRITES.append(bytes(data))
        self._t.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


class CountedHeadFirst(HeadFirstProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Counting(transport))  # type: ignore[arg-type]


class CountedPlain(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Counting(transport))  # type: ignore[arg-type]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/json":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})
    elif scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": False})
    elif scope["path"] == "/late":  # the head now, the body much later
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await asyncio.sleep(1.0)
        await send({"type": "http.response.body", "body": b"late"})


@pytest.mark.parametrize(("protocol", "json_writes"), [(CountedHeadFirst, 1), (CountedPlain, 2)])
def test_head_and_first_body_bytes_go_in_one_write(protocol: type, json_writes: int) -> None:
    WRITES.clear()
    with ServerThread(app, lifespan="off", http=protocol) as srv, httpx.Client(base_url=srv.url) as client:
        assert client.get("/json").json() == {"ok": True}
        assert len(WRITES) == json_writes  # plain uvicorn: the head, then the body
        WRITES.clear()
        r = client.get("/stream")
        assert r.text == "data: 1\n\ndata: 2\n\n"
        assert len(WRITES) == json_writes + 1  # the second event came later: a write of its own
        if protocol is CountedHeadFirst:
            assert WRITES[0].startswith(b"HTTP/1.1 200") and WRITES[0].endswith(b"data: 1\n\n\r\n")


def test_a_head_with_nothing_after_it_is_not_held_back() -> None:
    with ServerThread(app, lifespan="off", http=HeadFirstProtocol) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=0.5) as sock:
            sock.sendall(b"GET /late HTTP/1.1\r\nhost: x\r\n\r\n")
            head = sock.recv(65536)  # within 0.5 s, long before the body (1 s)
            assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
            sock.settimeout(3)
            assert sock.recv(65536) == b"late"


def test_the_gateway_keeps_idle_client_connections_longer_than_its_clients_do() -> None:
    """A client reuses a pooled connection for up to its keep-alive expiry; a server that closes first races it, and
    the request sent into the closing connection fails (the soak's ReadErrors under uvicorn's default 5 s)."""
    import openai._constants

    from router.wire import SERVER_OPTIONS

    clients = (openai._constants.DEFAULT_CONNECTION_LIMITS.keepalive_expiry, httpx.Limits().keepalive_expiry)
    assert SERVER_OPTIONS["timeout_keep_alive"] > max(c for c in clients if c is not None) + 1.0
