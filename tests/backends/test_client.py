"""backends.client over httpx.MockTransport: status handling, timeouts per phase, error translation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx2 as httpx
import pytest

from backends.client import WorkerClient, make_http_client
from router.core.config import BackendConfig, Timeouts
from router.core.errors import WorkerConnectError, WorkerProtocolError, WorkerStatusError, WorkerTimeout

BACKEND = BackendConfig(name="w", url="http://worker:8000", model="m", kv_budget_tokens=1000)
TIMEOUTS = Timeouts(connect_s=0.2, first_byte_s=0.2, between_chunks_s=0.2, response_s=0.2)


def _client(handler: Callable[[httpx.Request], object]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))  # type: ignore[arg-type]


async def _slow(parts: list[tuple[float, bytes]]) -> AsyncIterator[bytes]:
    for delay, data in parts:
        await asyncio.sleep(delay)
        yield data


async def test_ok_answer_streams_after_its_first_chunk() -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, content=_slow([(0, b"a"), (0.05, b"b"), (0.05, b"c")]))

    async with _client(handler) as http:
        resp = await WorkerClient(http, TIMEOUTS).open(BACKEND, "/v1/completions", b'{"x":1}', {"x-request-id": "r"})
        assert resp.first_chunk == b"a" and resp.status_code == 200
        assert await resp.read_rest() == b"abc"
        await resp.aclose()
    assert str(seen[0].url) == "http://worker:8000/v1/completions" and seen[0].content == b'{"x":1}'
    assert seen[0].headers["x-request-id"] == "r"


async def test_4xx_is_returned_5xx_raised_with_body() -> None:
    async with _client(lambda req: httpx.Response(404, json={"error": "nope"})) as http:
        resp = await WorkerClient(http, TIMEOUTS).open(BACKEND, "/v1/completions", b"{}", {})
        assert resp.status_code == 404
        await resp.aclose()
    async with _client(lambda req: httpx.Response(503, content=b"overloaded")) as http:
        with pytest.raises(WorkerStatusError) as info:
            await WorkerClient(http, TIMEOUTS).open(BACKEND, "/v1/completions", b"{}", {})
    assert info.value.status_code == 503 and info.value.body == b"overloaded" and info.value.before_first_byte


async def test_empty_ok_answer_is_a_protocol_error() -> None:
    async with _client(lambda req: httpx.Response(200, content=b"")) as http:
        with pytest.raises(WorkerProtocolError):
            await WorkerClient(http, TIMEOUTS).open(BACKEND, "/v1/completions", b"{}", {})


async def test_connect_error_and_first_byte_timeout_are_translated() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    async with _client(refuse) as http:
        with pytest.raises(WorkerConnectError) as info:
            await WorkerClient(http, TIMEOUTS).open(BACKEND, "/v1/completions", b"{}", {})
        assert info.value.before_first_byte and info.value.backend == "w"
        assert isinstance(info.value.__cause__, httpx.ConnectError)

    async with _client(lambda req: httpx.Response(200, content=_slow([(1.0, b"late")]))) as http:
        with pytest.raises(WorkerTimeout) as tinfo:
            await WorkerClient(http, TIMEOUTS).open(BACKEND, "/v1/completions", b"{}", {})
        assert tinfo.value.before_first_byte


async def test_between_chunk_timeout_mid_answer() -> None:
    async with _client(lambda req: httpx.Response(200, content=_slow([(0, b"a"), (1.0, b"b")]))) as http:
        resp = await WorkerClient(http, TIMEOUTS).open(BACKEND, "/v1/completions", b"{}", {})
        with pytest.raises(WorkerTimeout) as info:
            await resp.read_rest()
        assert not info.value.before_first_byte
        await resp.aclose()


async def test_pooled_client_settings() -> None:
    async with make_http_client(TIMEOUTS) as http:
        assert http.timeout.connect == 0.2 and http.timeout.read is not None and http.timeout.read > 0.2
        assert not http.follow_redirects
