"""backends.transport on the wire: an httpx client over aiohttp against raw loopback servers that
answer, stall, hang up mid-answer or refuse; what each failure becomes, and when a connection is
reused or closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx2 as httpx
import pytest

from backends.client import WorkerClient
from backends.listen import free_port
from backends.transport import AiohttpTransport
from router.core.config import BackendConfig, Timeouts
from router.core.errors import WorkerConnectError, WorkerTimeout

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
TIMEOUTS = Timeouts(connect_s=0.5, first_byte_s=0.5, between_chunks_s=0.3, response_s=0.5)


class Wire:
    """A raw HTTP/1.1 server on loopback: each connection runs ``handler``; it counts connections and
    notes when a client hung up on it."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.hung_up = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self.handler(reader, writer)
            await reader.read()  # the handler is done: wait for the client to close
            self.hung_up.set()
        except ConnectionError:  # written to after the client closed
            self.hung_up.set()
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()
            self.tasks.discard(task)


@contextlib.asynccontextmanager
async def wire(handler: Handler) -> AsyncIterator[tuple[Wire, str]]:
    w = Wire(handler)
    server = await asyncio.start_server(w._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield w, f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for task in list(w.tasks):
            task.cancel()
        await asyncio.gather(*w.tasks, return_exceptions=True)
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lengths = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
    length = lengths[0] if lengths else 0
    return head, await reader.readexactly(length)


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def streams_three_events(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:  # keep-alive: as many requests as the client sends
        try:
            await read_request(reader)
        except asyncio.IncompleteReadError:
            return
        writer.write(STREAM_HEAD)
        for i in range(3):
            writer.write(chunked(b"data: %d\n\n" % i))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=AiohttpTransport(), timeout=httpx.Timeout(2.0))


async def test_a_stream_arrives_chunk_by_chunk_and_the_connection_is_reused() -> None:
    async with wire(streams_three_events) as (w, url), client() as http:
        for _ in range(2):
            req = http.build_request("POST", url + "/v1/completions", content=b'{"x":1}', headers={"x-request-id": "r"})
            resp = await http.send(req, stream=True)
            assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
            assert [c async for c in resp.aiter_raw()] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
            await resp.aclose()
        assert w.connections == 1


async def test_the_request_goes_out_as_built() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\nno")

    async with wire(echo) as (_, url), client() as http:
        resp = await http.post(url + "/v1/chat/completions?a=1", content=b"hello", headers={"x-request-id": "abc"})
        assert (resp.status_code, resp.content, resp.reason_phrase) == (404, b"no", "Not Found")
    head, body = seen[0]
    assert head.startswith(b"POST /v1/chat/completions?a=1 HTTP/1.1\r\n") and body == b"hello"
    assert b"\r\nx-request-id: abc\r\n" in head.lower() and b"content-length: 5" in head.lower()


async def test_a_refused_connection_is_a_connect_error_not_a_timeout() -> None:
    async with client() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{free_port()}/health")
    backend = BackendConfig(name="w", url=f"http://127.0.0.1:{free_port()}", model="m", kv_budget_tokens=1000)
    async with client() as http:
        with pytest.raises(WorkerConnectError) as info:  # the gateway answers 502 for it, and retries
            await WorkerClient(http, TIMEOUTS).open(backend, "/v1/completions", b"{}", {})
        assert info.value.before_first_byte


async def test_a_worker_hanging_up_mid_answer_is_a_protocol_error() -> None:
    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + chunked(b"data: 0\n\n"))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()

    async with wire(dies) as (_, url), client() as http:
        resp = await http.send(http.build_request("POST", url + "/x", content=b"{}"), stream=True)
        chunks = resp.aiter_raw()
        assert await anext(chunks) == b"data: 0\n\n"
        with pytest.raises(httpx.RemoteProtocolError):
            await anext(chunks)
        await resp.aclose()
        with pytest.raises(httpx.RemoteProtocolError):  # no answer at all
            await http.post(url + "/x", content=b"{}")


async def test_a_silent_worker_is_a_read_timeout() -> None:
    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async with wire(stalls) as (_, url):
        async with httpx.AsyncClient(transport=AiohttpTransport(), timeout=httpx.Timeout(2.0, read=0.1)) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post(url + "/x", content=b"{}")


async def test_closing_an_unfinished_answer_closes_its_connection() -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD)
        for i in range(200):
            writer.write(chunked(b"data: %d\n\n" % i))
            await writer.drain()
            await asyncio.sleep(0.01)

    async with wire(endless) as (w, url), client() as http:
        backend = BackendConfig(name="w", url=url, model="m", kv_budget_tokens=1000)
        opened = await WorkerClient(http, TIMEOUTS).open(backend, "/v1/completions", b"{}", {})
        assert opened.first_chunk.startswith(b"data: 0")
        await opened.aclose()  # as the proxy does when its client went away
        await asyncio.wait_for(w.hung_up.wait(), 2.0)  # the worker learns at once (vLLM aborts the request)


async def test_a_between_chunks_timeout_is_the_worker_client_s() -> None:
    async def pauses(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + chunked(b"data: 0\n\n"))
        await asyncio.sleep(5)

    async with wire(pauses) as (_, url), client() as http:
        backend = BackendConfig(name="w", url=url, model="m", kv_budget_tokens=1000)
        opened = await WorkerClient(http, TIMEOUTS).open(backend, "/v1/completions", b"{}", {})
        with pytest.raises(WorkerTimeout) as info:
            await opened.read_rest()
        assert not info.value.before_first_byte
        await opened.aclose()


async def test_the_worker_client_knows_an_answer_has_ended_without_another_read() -> None:
    async def all_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(STREAM_HEAD + chunked(b"data: 0\n\n", b"data: 1\n\n") + b"0\r\n\r\n")

    def backend(url: str) -> BackendConfig:
        return BackendConfig(name="w", url=url, model="m", kv_budget_tokens=1000)

    async with wire(all_at_once) as (w, url), client() as http:
        workers = WorkerClient(http, TIMEOUTS)
        for _ in range(2):
            opened = await workers.open(backend(url), "/v1/completions", b"{}", {})
            assert opened.first_chunk == b"data: 0\n\ndata: 1\n\n"
            assert opened.ended  # the terminator came with the bytes: no read is needed to learn it
            assert await opened.next_chunk() is None
            await opened.aclose()
        assert w.connections == 1  # an answer known to have ended leaves its connection reusable

    async with wire(streams_three_events) as (w, url), client() as http:
        opened = await WorkerClient(http, TIMEOUTS).open(backend(url), "/v1/completions", b"{}", {})
        assert opened.first_chunk == b"data: 0\n\n" and not opened.ended  # more is on its way
        assert [c async for c in opened.chunks()] == [b"data: 1\n\n", b"data: 2\n\n"]
        assert opened.ended
        await opened.aclose()


async def test_the_session_is_made_on_first_use_and_closed_with_the_client() -> None:
    transport = AiohttpTransport(httpx.Limits(max_connections=2, keepalive_expiry=5.0))
    assert transport._session is None
    async with wire(streams_three_events) as (_, url):
        async with httpx.AsyncClient(transport=transport) as http:
            resp = await http.post(url + "/x", content=b"{}")
            assert resp.content == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
            session = transport._session
            assert session is not None and session.connector is not None and session.connector.limit == 2
        assert session.closed and transport._session is None
