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
"Gateway overhead"). Given that transport (``direct``), :class:`WorkerClient` sends the gateway's
requests straight through it and reads aiohttp's answer: httpx's client, request and response
objects then cost nothing on the hot path. ``httpx`` below means ``httpx2``.

Every httpx or aiohttp error is translated here into a :class:`router.core.errors.WorkerError`
subclass (``raise ... from exc``); nothing above this module sees their exceptions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import NoReturn

import aiohttp
import httpx2 as httpx

from backends.transport import AT_EOF, WORKER_KEEPALIVE_S, AiohttpTransport, httpx_error
from router.core.config import BackendConfig, Timeouts
from router.core.errors import (
    WorkerConnectError,
    WorkerError,
    WorkerProtocolError,
    WorkerStatusError,
    WorkerTimeout,
)

MAX_ERROR_BODY = 64 * 1024  # how much of a worker's 5xx body is kept for the error message


def worker_transport() -> AiohttpTransport:
    """The gateway's pool of worker connections."""
    return AiohttpTransport(httpx.Limits(max_connections=4096, keepalive_expiry=WORKER_KEEPALIVE_S))


def make_http_client(timeouts: Timeouts, transport: AiohttpTransport | None = None) -> httpx.AsyncClient:
    """The gateway's pooled client over ``transport`` (a new :func:`worker_transport` by default). Read
    deadlines are enforced per phase by :class:`WorkerClient`; httpx's own read timeout is only a backstop."""
    return httpx.AsyncClient(
        transport=transport or worker_transport(),
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
    detail = f"{type(exc).__name__}: {exc}".rstrip(": ")  # the operator's: it names hosts and ports
    kind: type[WorkerError] = WorkerProtocolError
    what = "answered badly"
    if isinstance(exc, httpx.TimeoutException):
        kind, what = WorkerTimeout, "timed out"
    elif isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
        kind, what = WorkerConnectError, "connection failed"
    public = f"worker {backend} {what} {where}"
    return kind(f"{public} ({detail})", backend=backend, before_first_byte=before_first_byte, public=public)


class WorkerResponse:
    """A worker's answer whose headers and first body chunk have arrived. Close it (``aclose``).

    Made from aiohttp's answer (:meth:`from_aiohttp`, the gateway's own client) or httpx's
    (:meth:`from_httpx`, an injected client); either way the body comes through ``read`` (an
    awaitable of the next bytes, empty or None at the end) and errors mid-body as WorkerErrors."""

    def __init__(
        self, backend: str, status_code: int, headers: Mapping[str, str], between_chunks_s: float,
        read: Callable[[], Awaitable[bytes | None]], at_eof: Callable[[], bool] | None,
        close: Callable[[], Awaitable[None]],
    ) -> None:  # fmt: skip
        self.backend = backend
        self.status_code = status_code
        self.headers = headers
        self.first_chunk = b""
        self._read, self._at_eof, self._close = read, at_eof, close
        self._more = True
        self._between_s = between_chunks_s
        self.max_bytes: int | None = None  # the most read_rest() takes (WorkerClient sets gateway.max_response_bytes)
        self.held: HeldBytes | None = None  # what every answer being read holds together (gateway.max_buffered_bytes)
        self.deadline: float | None = None  # the loop time by which read_rest() has it all (a non-streamed answer)
        self.stream_deadline: float | None = None  # the loop time by which a stream must have ended

    @classmethod
    def from_aiohttp(cls, backend: str, response: aiohttp.ClientResponse, between_chunks_s: float) -> WorkerResponse:
        content = response.content

        async def close() -> None:
            # close() drops the connection, release() hands it back to the pool: only a body read to its
            # end leaves the connection reusable (closing is how a worker learns a request was abandoned).
            if content.is_eof():
                response.release()
            else:
                response.close()

        return cls(backend, response.status, response.headers, between_chunks_s, content.readany, content.at_eof,
                   close)  # fmt: skip

    @classmethod
    def from_httpx(cls, backend: str, response: httpx.Response, between_chunks_s: float) -> WorkerResponse:
        # Workers are asked for identity encoding, but should one compress anyway, aiter_bytes
        # decodes, so the client gets plain bytes (the gateway does not pass content-encoding).
        # Otherwise aiter_raw: the same bytes through two fewer generator layers per chunk (but
        # only aiter_bytes serves a body already read, as a mock transport's may be). Raw bytes from
        # our own transport tell, without a read, whether the body has ended (AT_EOF).
        whole = "content-encoding" in response.headers or response.is_stream_consumed
        chunks = response.aiter_bytes() if whole else response.aiter_raw()

        async def close() -> None:
            await chunks.aclose()
            await response.aclose()

        at_eof = None if whole else response.extensions.get(AT_EOF)
        return cls(backend, response.status_code, response.headers, between_chunks_s,
                   lambda: anext(chunks, None), at_eof, close)  # fmt: skip

    async def _first(self) -> WorkerResponse:
        self.first_chunk = await self._read() or b""
        self._more = bool(self.first_chunk)
        return self

    @property
    def content_type(self) -> str:
        return str(self.headers.get("content-type", "application/json"))

    @property
    def ended(self) -> bool:
        """True when no body byte is left to read (known without reading where the transport
        tells: the proxy then sends its last chunk and the end of its own answer in one write;
        otherwise once :meth:`next_chunk` has answered None)."""
        if self._more and self._at_eof is not None and self._at_eof():
            self._more = False
        return not self._more

    async def next_chunk(self) -> bytes | None:
        """The next part of the body after ``first_chunk``, within the between-chunk timeout; None
        at its end."""
        if self.ended:
            return None
        until = asyncio.get_running_loop().time() + self._between_s
        ends = self.stream_deadline is not None and self.stream_deadline < until
        try:
            async with asyncio.timeout_at(self.stream_deadline if ends else until):
                chunk = await self._read()
        except TimeoutError as exc:
            if isinstance(exc, aiohttp.ClientError):  # aiohttp's socket timeout is a TimeoutError too
                raise _translate(httpx_error(exc), self.backend, before_first_byte=False) from exc
            said = (f"worker {self.backend} did not end its stream within gateway.timeouts.stream_s" if ends else
                    f"worker {self.backend} sent nothing for {self._between_s:g}s mid-response")  # fmt: skip
            raise WorkerTimeout(said, backend=self.backend, before_first_byte=False) from exc
        except aiohttp.ClientError as exc:
            raise _translate(httpx_error(exc), self.backend, before_first_byte=False) from exc
        except httpx.HTTPError as exc:
            raise _translate(exc, self.backend, before_first_byte=False) from exc
        if not chunk:
            self._more = False
            return None
        return chunk

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body after ``first_chunk``; each chunk must come within the between-chunk timeout."""
        while (chunk := await self.next_chunk()) is not None:
            yield chunk

    async def read_rest(self, cut_at: int | None = None) -> bytes:
        """The whole body (first chunk included), at most :attr:`max_bytes` of it: a longer one is a
        WorkerProtocolError naming the limit, with nothing sent on (a retry is safe). ``cut_at``: keep only that
        many bytes and stop reading there (an error's body, of which only the message is wanted)."""
        limit = cut_at if cut_at is not None else self.max_bytes
        parts, size = [self.first_chunk], len(self.first_chunk)
        held = self.held if self.held is not None else HeldBytes(None)
        held.take(size)
        try:
            async with asyncio.timeout_at(self.deadline):  # (None: no deadline but each chunk's)
                while (limit is None or size <= limit) and (chunk := await self.next_chunk()) is not None:
                    parts.append(chunk)
                    size += len(chunk)
                    if not held.take(len(chunk)):
                        parts.clear()
                        raise WorkerProtocolError(f"worker {self.backend}'s answer was refused: the gateway holds "
                                                  f"{held.limit} bytes of answers being read (gateway.max_buffered_"
                                                  "bytes)", backend=self.backend)  # fmt: skip
        except TimeoutError:
            raise WorkerTimeout(f"worker {self.backend} did not finish its answer within gateway.timeouts.response_s",
                                backend=self.backend) from None  # fmt: skip
        finally:
            held.give(size)
        if limit is not None and size > limit and cut_at is None:
            parts.clear()  # (the error's traceback holds this frame: it must not hold the answer too)
            raise WorkerProtocolError(f"worker {self.backend} answered more than {limit} bytes "
                                      "(gateway.max_response_bytes)", backend=self.backend)  # fmt: skip
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        return body if limit is None or size <= limit else body[:limit]

    async def aclose(self) -> None:
        # Closing an unfinished response closes its connection, which is how a worker learns that
        # the request was abandoned (vLLM then aborts it).
        await self._close()


class HeldBytes:
    """The bytes every non-streamed answer being read holds together, against ``limit`` (None: no limit)."""

    __slots__ = ("limit", "now")

    def __init__(self, limit: int | None) -> None:
        self.limit, self.now = limit, 0

    def take(self, n: int) -> bool:
        """Count ``n`` more; False where that passes the limit (they are counted all the same: give them back)."""
        self.now += n
        return self.limit is None or self.now <= self.limit

    def give(self, n: int) -> None:
        self.now -= n


class WorkerClient:
    """Sends requests to workers over an injected pooled client (not owned: the caller closes it).
    ``direct``: that client's :class:`AiohttpTransport`, where it has one (what :func:`make_http_client`
    builds); requests then go straight through it, past httpx's objects."""

    def __init__(self, client: httpx.AsyncClient, timeouts: Timeouts, direct: AiohttpTransport | None = None,
                 max_response_bytes: int | None = None, max_buffered_bytes: int | None = None) -> None:  # fmt: skip
        self._client = client
        self._timeouts = timeouts
        self._max_bytes = max_response_bytes
        self._held = HeldBytes(max_buffered_bytes)
        self._direct = direct
        self._direct_timeout = direct.timeout(client.timeout.as_dict()) if direct is not None else None
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
        limit = self._timeouts.first_byte_s if stream else self._timeouts.response_s
        deadline = asyncio.get_running_loop().time() + limit
        opened = await (self._open_direct if self._direct is not None else self._open_httpx)(
            backend, path, body, headers, limit
        )
        opened.max_bytes, opened.held = self._max_bytes, self._held
        if not stream:  # a non-streamed answer is whole within response_s, however its bytes trickle
            opened.deadline = deadline
        else:  # and a stream ends within stream_s, however it trickles
            opened.stream_deadline = deadline - limit + self._timeouts.stream_s
        if opened.status_code >= 500:
            await self._raise_status(opened)
        if opened.status_code < 300 and not opened.first_chunk:
            await opened.aclose()
            raise WorkerProtocolError(f"worker {backend.name} answered {opened.status_code} with no body",
                                      backend=backend.name)  # fmt: skip
        return opened

    async def _open_direct(
        self, backend: BackendConfig, path: str, body: bytes, headers: Mapping[str, str], limit: float
    ) -> WorkerResponse:
        direct, between = self._direct, self._timeouts.between_chunks_s
        assert direct is not None and self._direct_timeout is not None
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(limit):
                response = await direct.post(backend.url + path, headers, body, self._direct_timeout)
                if "content-encoding" in response.headers:  # httpx decodes it (workers are asked for identity)
                    return await WorkerResponse.from_httpx(backend.name, direct.as_httpx(response), between)._first()
                return await WorkerResponse.from_aiohttp(backend.name, response, between)._first()
        except aiohttp.ClientError as exc:  # before TimeoutError: aiohttp's socket timeout is one too
            if response is not None:
                response.close()
            raise _translate(httpx_error(exc), backend.name, before_first_byte=True) from exc
        except TimeoutError as exc:
            if response is not None:
                response.close()
            raise WorkerTimeout(f"worker {backend.name} sent no byte within {limit:g}s", backend=backend.name) from exc
        except BaseException:
            if response is not None:
                response.close()
            raise

    async def _open_httpx(
        self, backend: BackendConfig, path: str, body: bytes, headers: Mapping[str, str], limit: float
    ) -> WorkerResponse:
        request = self._request(backend, path, body, headers)
        response: httpx.Response | None = None
        try:
            async with asyncio.timeout(limit):
                response = await self._client.send(request, stream=True)
                return await WorkerResponse.from_httpx(backend.name, response, self._timeouts.between_chunks_s)._first()
        except TimeoutError as exc:
            await _close_quietly(response)
            raise WorkerTimeout(f"worker {backend.name} sent no byte within {limit:g}s", backend=backend.name) from exc
        except httpx.HTTPError as exc:
            await _close_quietly(response)
            raise _translate(exc, backend.name, before_first_byte=True) from exc
        except BaseException:
            await _close_quietly(response)
            raise

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
                body = await opened.read_rest(cut_at=MAX_ERROR_BODY)
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
