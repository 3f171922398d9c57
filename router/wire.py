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

It also bounds how long a client may take to send a request (:data:`REQUEST_IDLE_S` without a byte of
its head or body, and :data:`REQUEST_IDLE_S` for the whole head, however it trickles): uvicorn has no
such limit, so a client that opens connections and trickles their heads (slowloris) or stops half-way
through a body could hold the gateway's sockets forever.
A head cut off that way is answered 408 and the connection closed; a body, by closing the
connection (the request then ends as a client disconnect, 499). Between requests uvicorn's own
keep-alive timeout applies.

And it bounds a request's head (``gateway.max_header_bytes``, read from the gateway's lifespan state; else
:data:`MAX_HEADER_BYTES`): uvicorn's httptools protocol buffers a head whole, however large, before the app sees a
byte. The bytes of a head still incomplete are counted as they arrive, and a complete head is measured; past the
limit the client gets 431 in OpenAI's error envelope and the connection is closed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_HEAD = b"HTTP/1.1 "  # how every response head uvicorn writes starts (its STATUS_LINE table)
REQUEST_IDLE_S = 30.0  # the longest a request's head or body may go without a byte (nginx's client_*_timeout)
_TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
MAX_HEADER_BYTES = 64 * 1024  # gateway.max_header_bytes's default, for an app that has no gateway state


def _too_large_431(limit: int) -> bytes:
    body = json.dumps({"error": {"message": f"the request's headers are larger than the gateway's limit of {limit} "
                                            "bytes (gateway.max_header_bytes)", "type": "invalid_request_error",
                                 "param": None, "code": "request_header_fields_too_large"}}).encode()  # fmt: skip
    return (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))  # fmt: skip


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


class _HeadTooLarge(Exception):
    """Raised from a parser callback: httptools stops parsing and re-raises it from ``feed_data``."""


class HeadFirstProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a :class:`HeadHoldingTransport`, with a deadline on reading
    each request (:data:`REQUEST_IDLE_S` without progress)."""

    idle_s = REQUEST_IDLE_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        holding = HeadHoldingTransport(transport, self.loop)
        super().connection_made(holding)  # type: ignore[arg-type]
        gateway = self.app_state.get("gateway")  # router.gateway.STATE_KEY, set by the app's lifespan
        self._max_head = gateway.config.gateway.max_header_bytes if gateway is not None else MAX_HEADER_BYTES
        self._head_bytes = 0  # of the head being read, counted while it is incomplete
        self._refused = False  # a head past the limit was answered 431: the connection is closing
        # One timer per connection, not per request: it checks the request being read when it fires and
        # re-arms itself for the rest of the allowance, so a busy keep-alive connection costs one timer
        # per REQUEST_IDLE_S, and a request only a few attribute stores.
        self._reading = True  # a request's head or body is (or may be) still coming
        self._in_head = True  # ... its head
        self._read_at = self._head_at = self.loop.time()  # its last progress; when its head began
        self._read_timer: asyncio.TimerHandle | None = self.loop.call_later(self.idle_s, self._read_idle)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._head_bytes += len(data)  # (the head may end inside ``data``: then on_headers_complete decides)
        super().data_received(data)
        if self._in_head and self._head_bytes > self._max_head:
            self._refuse_head()

    def _refuse_head(self) -> None:
        if not self._refused:
            self._refused = True
            self.transport.write(_too_large_431(self._max_head))
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # (the parser's error after a refused head is that refusal's, already answered)
            super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading = self._in_head = True
        self._head_bytes = 0
        self._read_at = self._head_at = self.loop.time()
        if self._read_timer is None:
            self._read_timer = self.loop.call_later(self.idle_s, self._read_idle)

    def on_headers_complete(self) -> None:
        self._in_head, self._read_at = False, self.loop.time()
        size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
        if size > self._max_head:
            self._refuse_head()
            raise _HeadTooLarge  # (stops the parser: nothing of this request reaches the app)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._read_at = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._reading = False
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        super().connection_lost(exc)

    def _read_idle(self) -> None:
        """The timer: gone where no request is being read (the next one arms it again), re-armed for the
        rest of the allowance where the request made progress (or the app is not reading its body yet),
        else the connection is closed."""
        self._read_timer = None
        if not self._reading or self.transport.is_closing():
            return
        now = self.loop.time()
        waited = now - self._read_at
        head_left = self.idle_s - (now - self._head_at) if self._in_head else self.idle_s  # a head has idle_s in all
        if head_left > 0 and (waited < self.idle_s or self.flow.read_paused):
            self._read_timer = self.loop.call_later(max(min(self.idle_s - waited, head_left), 0.001), self._read_idle)
            return
        if self._in_head and (self.cycle is None or self.cycle.response_complete):  # no app has it yet
            self.transport.write(_TIMEOUT_408)
        self.transport.close()


#: How long the gateway keeps an idle client connection open. Longer than its clients keep theirs: the openai SDK's
#: and httpx's pools reuse an idle connection for up to 5 s, uvicorn's default close is also at 5 s, and a request
#: sent as the server closes its connection fails with a read error (a POST is not retried by httpx; the soak saw
#: it, docs/benchmarks.md). 75 s also outlasts a load balancer's usual 60-s idle timeout in front of the gateway.
CLIENT_KEEPALIVE_S = 75

# How the gateway's uvicorn server runs, for `chimera serve` and the bench's gateway processes alike:
# this protocol, uvicorn's own logs only for warnings, no access log (the request log has it all), idle client
# connections kept CLIENT_KEEPALIVE_S.
SERVER_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {"http": HeadFirstProtocol, "log_level": "warning", "access_log": False, "timeout_keep_alive": CLIENT_KEEPALIVE_S}
)
