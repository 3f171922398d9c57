"""The worker client: the one place the gateway talks HTTP to workers.

One pooled ``httpx.AsyncClient`` is shared by every request (created in the app's lifespan, or
injected by tests). :meth:`WorkerClient.open` sends a request and waits for the *first body byte*,
so the caller still holds the whole answer back from its own client at that point and can retry
elsewhere on any failure. After that, :meth:`WorkerResponse.chunks` yields the rest with a
between-chunk deadline.

The client is ``httpx2`` (pydantic's maintained successor of httpx, same API; the openai SDK
uses it too) and the one :func:`make_http_client` builds sends through
:class:`backends.transport.AiohttpTransport`: httpcore's pool polls every idle connection on each
request, and with it the client side of a proxied request cost ~3x aiohttp's (docs/benchmarks.md,
"Gateway overhead"). ``httpx`` below means ``httpx2``.

Every httpx error is translated here into a :class:`router.core.errors.WorkerError` subclass
(``raise ... from exc``); nothing above this module sees httpx exceptions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import NoReturn

import httpx2 as httpx

from backends.transport import AT_EOF, WORKER_KEEPALIVE_S, AiohttpTransport
from router.core.config import BackendConfig, Timeouts
from router.core.errors import (
    WorkerConnectError,
    WorkerError,
    WorkerProtocolError,
    WorkerStatusError,
    WorkerTimeout,
)

MAX_ERROR_BODY = 64 * 1024  # how much of a worker's 5xx body is kept for the error message


def make_http_client(timeouts: Timeouts) -> httpx.AsyncClient:
    """The gateway's pooled client. Read deadlines are enforced per phase by :class:`WorkerClient`;
    httpx's own read timeout is only a backstop."""
    return httpx.AsyncClient(
        transport=AiohttpTransport(httpx.Limits(max_connections=4096, keepalive_expiry=WORKER_KEEPALIVE_S)),
        timeout=httpx.Timeout(
            connect=timeouts.connect_s,
            read=max(timeouts.first_byte_s, timeouts.between_chunks_s, timeouts.response_s) + 1.0,
            write=timeouts.first_byte_s,
            pool=timeouts.first_byte_s,
        ),
        trust_env=False,  # workers are addressed directly; an HTTP_PROXY in the env must not capture them
        follow_redirects=False,
    )


def _translate(exc: httpx.HTTPError, backend: str, *, before_first_byte: bool) -> WorkerError:
    where = "before the first byte" if before_first_byte else "mid-response"
    detail = f"{type(exc).__name__}: {exc}".rstrip(": ")
    if isinstance(exc, httpx.TimeoutException):
        return WorkerTimeout(f"worker {backend} timed out {where} ({detail})", backend=backend,
                             before_first_byte=before_first_byte)  # fmt: skip
    if isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
        return WorkerConnectError(f"worker {backend} connection failed {where} ({detail})", backend=backend,
                                  before_first_byte=before_first_byte)  # fmt: skip
    return WorkerProtocolError(f"worker {backend} answered badly {where} ({detail})", backend=backend,
                               before_first_byte=before_first_byte)  # fmt: skip


class WorkerResponse:
    """A worker's answer whose headers and first body chunk have arrived. Close it (``aclose``)."""

    def __init__(
        self, backend: str, response: httpx.Response, first_chunk: bytes, more: bool, between_chunks_s: float
    ) -> None:
        self.backend = backend
        self.status_code = response.status_code
        self.headers = response.headers
        self.first_chunk = first_chunk
        self._response = response
        # Workers are asked for identity encoding, but should one compress anyway, aiter_bytes
        # decodes, so the client gets plain bytes (the gateway does not pass content-encoding).
        # Otherwise aiter_raw: the same bytes through two fewer generator layers per chunk (but
        # only aiter_bytes serves a body already read, as a mock transport's may be).
        whole = "content-encoding" in response.headers or response.is_stream_consumed
        self._iter = response.aiter_bytes() if whole else response.aiter_raw()
        # Raw bytes from our own transport can tell, without a read, that the body has ended (the
        # worker's last bytes came with what was just read): the proxy then sends its last chunk
        # and the end of its own answer in one write, and skips a read that would only say "end".
        self._at_eof: Callable[[], bool] | None = None if whole else response.extensions.get(AT_EOF)
        self._more = more
        self._between_s = between_chunks_s

    @classmethod
    async def _open(cls, backend: str, response: httpx.Response, between_chunks_s: float) -> WorkerResponse:
        self = cls(backend, response, b"", True, between_chunks_s)
        first = await anext(self._iter, None)
        self.first_chunk = first or b""
        self._more = first is not None
        return self

    @property
    def content_type(self) -> str:
        return str(self.headers.get("content-type", "application/json"))

    @property
    def ended(self) -> bool:
        """True when no body byte is left to read (known without reading where the transport
        tells; otherwise once :meth:`next_chunk` has answered None)."""
        if self._more and self._at_eof is not None and self._at_eof():
            self._more = False
        return not self._more

    async def next_chunk(self) -> bytes | None:
        """The next part of the body after ``first_chunk``, within the between-chunk timeout; None
        at its end."""
        if self.ended:
            return None
        try:
            async with asyncio.timeout(self._between_s):
                chunk = await anext(self._iter, None)
        except TimeoutError as exc:
            raise WorkerTimeout(
                f"worker {self.backend} sent nothing for {self._between_s:g}s mid-response",
                backend=self.backend, before_first_byte=False,
            ) from exc  # fmt: skip
        except httpx.HTTPError as exc:
            raise _translate(exc, self.backend, before_first_byte=False) from exc
        if chunk is None:
            self._more = False
        return chunk

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body after ``first_chunk``; each chunk must come within the between-chunk timeout."""
        while (chunk := await self.next_chunk()) is not None:
            yield chunk

    async def read_rest(self) -> bytes:
        """The whole body (first chunk included)."""
        parts = [self.first_chunk]
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def aclose(self) -> None:
        # Closing an unfinished response closes its connection, which is how a worker learns that
        # the request was abandoned (vLLM then aborts it).
        await self._iter.aclose()
        await self._response.aclose()


class WorkerClient:
    """Sends requests to workers over an injected pooled client (not owned: the caller closes it)."""

    def __init__(self, client: httpx.AsyncClient, timeouts: Timeouts) -> None:
        self._client = client
        self._timeouts = timeouts
        self._urls: dict[tuple[str, str], tuple[httpx.URL, bytes]] = {}  # (URL, Host) per worker and path

    async def open(
        self, backend: BackendConfig, path: str, body: bytes, headers: Mapping[str, str], *, stream: bool = True
    ) -> WorkerResponse:
        """POST ``body`` and wait for the answer's first body byte: within ``first_byte_s`` for a
        stream; within ``response_s`` for a non-streamed answer, which arrives whole at the end.

        Returns 2xx and 4xx answers (a 4xx is the caller's mistake, not the worker's failure).
        Raises :class:`WorkerStatusError` for a 5xx and another :class:`WorkerError` for a
        connect error, a timeout, or a broken or empty 2xx answer, all with ``before_first_byte=True``.
        """
        request = self._request(backend, path, body, headers)
        response: httpx.Response | None = None
        limit = self._timeouts.first_byte_s if stream else self._timeouts.response_s
        try:
            async with asyncio.timeout(limit):
                response = await self._client.send(request, stream=True)
                opened = await WorkerResponse._open(backend.name, response, self._timeouts.between_chunks_s)
        except TimeoutError as exc:
            await _close_quietly(response)
            raise WorkerTimeout(f"worker {backend.name} sent no byte within {limit:g}s", backend=backend.name) from exc
        except httpx.HTTPError as exc:
            await _close_quietly(response)
            raise _translate(exc, backend.name, before_first_byte=True) from exc
        except BaseException:
            await _close_quietly(response)
            raise
        if opened.status_code >= 500:
            await self._raise_status(opened)
        if opened.status_code < 300 and not opened.first_chunk:
            await opened.aclose()
            raise WorkerProtocolError(f"worker {backend.name} answered {opened.status_code} with no body",
                                      backend=backend.name)  # fmt: skip
        return opened

    def _request(self, backend: BackendConfig, path: str, body: bytes, headers: Mapping[str, str]) -> httpx.Request:
        """The request, whole: sent as it is, without the client's default headers and cookies (a
        worker needs none of them), its URL parsed once per worker and path, and Host and
        Content-Length set here (``stream=`` rather than ``content=``: httpx then adds nothing).
        A third of what ``client.build_request`` costs."""
        found = self._urls.get((backend.url, path))
        if found is None:
            url = httpx.URL(backend.url + path)
            found = self._urls[backend.url, path] = (url, url.netloc)
        url, host = found
        head = [(b"host", host), (b"content-length", str(len(body)).encode())]
        head += [(k.encode(), v.encode()) for k, v in headers.items()]
        request = httpx.Request("POST", url, headers=head, stream=httpx.ByteStream(body))
        request.read()  # the body is already bytes: this only records them as the request's content
        return request

    async def _raise_status(self, opened: WorkerResponse) -> NoReturn:
        try:
            async with asyncio.timeout(self._timeouts.between_chunks_s):
                body = await opened.read_rest()
        except (WorkerError, TimeoutError):
            body = opened.first_chunk
        finally:
            await opened.aclose()
        raise WorkerStatusError(
            f"worker {opened.backend} answered {opened.status_code}",
            status_code=opened.status_code, body=body[:MAX_ERROR_BODY], backend=opened.backend,
        )  # fmt: skip


async def _close_quietly(response: httpx.Response | None) -> None:
    if response is not None:
        await response.aclose()
