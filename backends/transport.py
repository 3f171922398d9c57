"""httpx's transport seam over aiohttp's connection pool: the worker client's wire.

:class:`AiohttpTransport` is an ``httpx.AsyncBaseTransport`` (``httpx`` is ``httpx2`` here), so
the gateway keeps one ``httpx.AsyncClient`` API (and tests keep ``MockTransport``) while the
bytes move through aiohttp, whose HTTP parser and pool are C-accelerated: with the gateway on one
core, the client side of a proxied request costs about half of httpcore's
(docs/benchmarks.md, "Gateway: the worker client's connection pool").

It does what ``httpx-aiohttp``'s transport does, with two differences that matter to a gateway:

- aiohttp's errors become the httpx errors of the same meaning: a refused connection is
  ``ConnectError`` (httpx-aiohttp reports it as ``ConnectTimeout``, which would answer a dead
  worker with 504 instead of 502), a peer that hung up mid-answer ``RemoteProtocolError``, a
  silent socket ``ReadTimeout``;
- closing a response whose body was not read to its end closes its connection, so a worker
  learns at once that the request was abandoned (vLLM then aborts it);
- the response's ``AT_EOF`` extension tells whether the raw body has already ended with what was
  read, without another read (the proxy then closes its own answer in the same write).

The gateway's own requests to workers skip httpx's objects altogether: :meth:`AiohttpTransport.post`
sends through the same session and returns aiohttp's answer (backends.client reads it directly), so
httpx's client, request and response layers cost nothing there (measured on a 2-core VM at 1,000
requests/s: the gateway's CPU a request fell from 740-820 to about 645 us).

The aiohttp session is made on first use, inside the running event loop, and closed by
:meth:`aclose`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import aiohttp
import httpx2 as httpx
from multidict import CIMultiDict
from yarl import URL

_HTTP11 = b"HTTP/1.1"
# The response extension (httpx's way for a transport to say more than HTTP does) holding a
# callable that tells whether the raw body has ended with what has been read so far.
AT_EOF = "chimera.at_eof"
_CACHE_LIMIT = 1024  # URLs and timeouts are few (workers x paths); the bound only guards odd callers
# How long an idle worker connection stays pooled: less than vLLM's own keep-alive timeout
# (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default), so a request is never sent on a connection the worker is
# closing (which would fail it there and count against a healthy worker).
WORKER_KEEPALIVE_S = 4.0


def httpx_error(exc: aiohttp.ClientError, request: httpx.Request | None = None) -> httpx.TransportError:
    """aiohttp's error as the httpx error of the same meaning (most specific first)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(str(exc) or "connect timed out", request=request)
    if isinstance(exc, aiohttp.ServerTimeoutError):  # SocketTimeoutError and its kin: the socket went quiet
        return httpx.ReadTimeout(str(exc) or "read timed out", request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(exc), request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError):
        return httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request)
    if isinstance(exc, aiohttp.ClientOSError):
        return httpx.ReadError(str(exc), request=request)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(str(exc), request=request)
    return httpx.TransportError(str(exc) or type(exc).__name__, request=request)


@contextmanager
def _mapped(request: httpx.Request | None) -> Iterator[None]:
    """Re-raise aiohttp's errors as httpx's, ``from`` the original."""
    try:
        yield
    except aiohttp.ClientError as exc:
        raise httpx_error(exc, request) from exc


class ResponseStream(httpx.AsyncByteStream):
    """An aiohttp answer's body as httpx's byte stream."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request | None) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        with _mapped(self._request):
            while chunk := await content.readany():
                yield chunk

    def at_eof(self) -> bool:
        """True when the body has ended and every byte of it has been read."""
        return self._response.content.at_eof()

    async def aclose(self) -> None:
        # close() drops the connection, release() hands it back to the pool: only a body read to
        # its end leaves the connection reusable.
        if self._response.content.is_eof():
            self._response.release()
        else:
            self._response.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over one pooled ``aiohttp.ClientSession`` (made on first use, closed by :meth:`aclose`)."""

    def __init__(self, limits: httpx.Limits | None = None) -> None:
        self._limits = limits or httpx.Limits()
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}
        self._timeouts: dict[tuple[Any, ...], aiohttp.ClientTimeout] = {}

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self._limits.max_connections or 0,
            limit_per_host=0,
            keepalive_timeout=self._limits.keepalive_expiry,
        )
        # Answers are passed on as they came (httpx decodes a content-encoding); no cookie jar, no
        # proxies from the environment (workers are addressed directly).
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),  # httpx sent its own
        )
        return self._session

    def _url(self, url: httpx.URL) -> URL:
        return self._url_of(str(url))

    def _url_of(self, text: str) -> URL:
        found = self._urls.get(text)
        if found is None:
            if len(self._urls) >= _CACHE_LIMIT:
                self._urls.clear()
            found = self._urls[text] = URL(text, encoded=True)
        return found

    def _timeout(self, request: httpx.Request) -> aiohttp.ClientTimeout:
        return self.timeout(request.extensions.get("timeout") or {})

    def timeout(self, t: Mapping[str, float | None]) -> aiohttp.ClientTimeout:
        """httpx's timeouts (``httpx.Timeout.as_dict()``, or a request's ``timeout`` extension) as aiohttp's."""
        key = (t.get("connect"), t.get("read"), t.get("pool"))
        found = self._timeouts.get(key)
        if found is None:
            if len(self._timeouts) >= _CACHE_LIMIT:
                self._timeouts.clear()
            # connect: a pooled connection or a new one (httpx's pool + connect); sock_read: the
            # longest silence while the answer is read (httpx's read timeout).
            pool, connect = key[2], key[0]
            found = self._timeouts[key] = aiohttp.ClientTimeout(
                total=None, connect=None if pool is None or connect is None else pool + connect,
                sock_connect=connect, sock_read=key[1],
            )  # fmt: skip
        return found

    async def post(
        self, url: str, headers: Mapping[str, str], body: bytes, limits: aiohttp.ClientTimeout
    ) -> aiohttp.ClientResponse:
        """POST ``body`` straight through the session, past httpx's request and response objects: the
        gateway's hot path (backends.client). ``limits``: the socket's timeouts (:meth:`timeout`). aiohttp's
        errors are raised as they are."""
        session = self._session or self._open()
        return await session.request("POST", self._url_of(url), headers=headers, data=body, allow_redirects=False,
                                     timeout=limits)  # fmt: skip

    def as_httpx(self, response: aiohttp.ClientResponse, request: httpx.Request | None = None) -> httpx.Response:
        """An aiohttp answer as httpx's, its body streamed (httpx decodes a ``content-encoding``)."""
        stream = ResponseStream(response, request)
        extensions: dict[str, Any] = {"http_version": _HTTP11, AT_EOF: stream.at_eof}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode("latin-1", "replace")
        return httpx.Response(
            response.status, headers=response.raw_headers, stream=stream, request=request, extensions=extensions,
        )  # fmt: skip

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session or self._open()
        data: bytes | AsyncIterator[bytes] | None
        try:
            data = request.content or None
        except httpx.RequestNotRead:
            data = _body(request)
        headers = CIMultiDict((k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw)
        if not isinstance(data, bytes | None):
            headers.popall("transfer-encoding", None)  # aiohttp frames a streamed body itself
        with _mapped(request):
            response = await session.request(
                request.method, self._url(request.url), headers=headers, data=data,
                allow_redirects=False, timeout=self._timeout(request),
            )  # fmt: skip
        return self.as_httpx(response, request)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _body(request: httpx.Request) -> AsyncIterator[bytes]:
    assert isinstance(request.stream, httpx.AsyncByteStream)
    async for chunk in request.stream:
        yield chunk
