"""The gateway's HTTP/1.1 server protocol: uvicorn's httptools protocol, writing a response's head
and its first body bytes in one system call.

uvicorn writes each ASGI message as it comes: the status line and headers on
``http.response.start``, then each body chunk. A proxied answer is in hand when its head is sent,
so those are two writes, two wake-ups of the client, where one would do (and where system calls
are dear, as under gVisor, each costs more than the Python around it). :class:`HeadFirstProtocol`
gives uvicorn a transport that holds a response head until the next write, which it joins, or
until the end of the event loop's current pass, whichever comes first: nothing waits longer than a
pass of the loop, and what is written keeps its order.

    uvicorn.run(app, http=HeadFirstProtocol)
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_HEAD = b"HTTP/1.1 "  # how every response head uvicorn writes starts (its STATUS_LINE table)


class HeadHoldingTransport:
    """A transport that holds a write starting a response head (see the module) and passes
    everything else through to the real one."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush_at_end_of_pass: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            assert self._flush_at_end_of_pass is not None
            self._flush_at_end_of_pass.cancel()
            self._transport.write(held + bytes(data))
        elif isinstance(data, bytes) and data.startswith(_HEAD):
            self._held = data
            self._flush_at_end_of_pass = self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Write what is held now."""
        held, self._held = self._held, None
        if held is not None:
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # every other transport method, as it is
        return getattr(self._transport, name)


class HeadFirstProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a :class:`HeadHoldingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        holding = HeadHoldingTransport(transport, self.loop)
        super().connection_made(holding)  # type: ignore[arg-type]


# How the gateway's uvicorn server runs, for `chimera serve` and the bench's gateway processes alike:
# this protocol, uvicorn's own logs only for warnings, no access log (the request log has it all).
SERVER_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {"http": HeadFirstProtocol, "log_level": "warning", "access_log": False}
)
