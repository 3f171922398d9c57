"""Rate-limit token buckets through the FleetState: the same tests against memory and Redis (the
shared server on 127.0.0.1:6379, fresh key prefix per test), then a 429 through the gateway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import openai
import pytest

from backends.listen import free_port
from router.core.config import HealthConfig
from router.core.stateurl import RedisOptions
from router.state.base import FleetState
from router.state.memory import MemoryFleetState
from router.state.redis_state import RedisFleetState
from tests.conftest import ServerThread, make_config
from tests.redisutil import SHARED_URL, redis_prefix
from tests.state.test_memory_state import BACKENDS

__all__ = ["redis_prefix"]  # a fixture
Make = Callable[[], Awaitable[FleetState]]


@pytest.fixture(params=["memory", "redis"])
async def make_state(request: pytest.FixtureRequest) -> AsyncIterator[Make]:
    made: list[FleetState] = []

    async def make() -> FleetState:
        if request.param == "memory":
            st: FleetState = MemoryFleetState(BACKENDS, HealthConfig())
        else:  # every replica made in one test shares the prefix: one set of buckets
            st = RedisFleetState(BACKENDS, HealthConfig(), RedisOptions(SHARED_URL, prefix=request.getfixturevalue(
                "redis_prefix")))  # fmt: skip
        await st.start()
        made.append(st)
        return st

    yield make
    for st in made:
        await st.close()


async def test_requests_per_minute_refill_continuously(make_state: Make) -> None:
    st = await make_state()
    assert await st.take_tokens("a", 600, 0, 600, None) == 0  # a full minute's allowance at once
    wait = await st.take_tokens("a", 1, 0, 600, None)
    assert 0.02 < wait <= 0.11  # 10 per second
    await asyncio.sleep(0.15)
    assert await st.take_tokens("a", 1, 0, 600, None) == 0
    assert await st.take_tokens("b", 1, 0, 600, None) == 0  # agents have their own buckets


async def test_tokens_per_minute_and_all_or_nothing(make_state: Make) -> None:
    st = await make_state()
    assert await st.take_tokens("a", 1, 6000, 60, 6000) == 0
    wait = await st.take_tokens("a", 1, 600, 60, 6000)  # 600 tokens at 100 per second
    assert 5.5 < wait <= 6.0
    # the refused request took nothing: 59 requests (of no tokens) are still there
    assert await st.take_tokens("a", 59, 0, 60, 6000) == 0
    assert await st.take_tokens("a", 1, 0, 60, 6000) > 0.5


async def test_a_request_larger_than_a_minute_passes_when_full(make_state: Make) -> None:
    st = await make_state()
    assert await st.take_tokens("a", 1, 50_000, None, 1000) == 0
    assert await st.take_tokens("a", 1, 10, None, 1000) > 0
    assert await st.take_tokens("a", 5, 5, None, None) == 0  # no limits: never waits


async def test_replicas_share_one_bucket(make_state: Make) -> None:
    a, b = await make_state(), await make_state()
    assert await a.take_tokens("x", 10, 0, 10, None) == 0
    wait = await b.take_tokens("x", 1, 0, 10, None)
    if isinstance(b, RedisFleetState):
        assert wait > 0  # one limit for the fleet
    else:
        assert wait == 0  # memory: each gateway process limits on its own


async def test_redis_unreachable_falls_back_to_local_buckets() -> None:
    st = RedisFleetState(BACKENDS, HealthConfig(), RedisOptions(f"redis://127.0.0.1:{free_port()}/0"))
    await st.start()
    try:
        assert st.degraded
        assert await st.take_tokens("a", 2, 0, 2, None) == 0
        assert await st.take_tokens("a", 1, 0, 2, None) > 0
    finally:
        await st.close()


def test_gateway_answers_429_with_retry_after(sim_server: Callable[..., ServerThread],
                                              gateway_server: Callable[..., ServerThread]) -> None:  # fmt: skip
    w = sim_server(model="m")
    cfg = make_config([{"name": "w0", "url": w.url, "model": "m"}],
                      agents=[{"name": "chat", "models": ["m"], "rpm": 2}], default_agent="chat")  # fmt: skip
    gw = gateway_server(cfg)
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0) as client:
        for _ in range(2):
            client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        with pytest.raises(openai.RateLimitError) as err:
            client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert err.value.response.headers["retry-after"] == "30"  # one request per 30 s
    assert err.value.code == "rate_limit_exceeded"


async def test_a_negative_take_gives_back_never_above_a_minute(make_state: Make) -> None:
    st = await make_state()
    assert await st.take_tokens("a", 2, 0, 2, None) == 0
    assert await st.take_tokens("a", 1, 0, 2, None) > 0
    assert await st.take_tokens("a", -1, 0, 2, None) == 0  # a refund (a request turned away after its take)
    assert await st.take_tokens("a", 1, 0, 2, None) == 0
    assert await st.take_tokens("a", 1, 0, 2, None) > 0
    for _ in range(5):  # refunds beyond the allowance do not raise it
        await st.take_tokens("b", -1, -100, 2, 100)
    assert await st.take_tokens("b", 2, 100, 2, 100) == 0
    assert await st.take_tokens("b", 1, 0, 2, 100) > 0


Srv = Callable[..., ServerThread]


def test_requests_admission_turns_away_do_not_spend_the_rate_limit(fake_server: Srv, gateway_server: Srv) -> None:
    from tests.e2e.fakes import FakeWorker

    cfg = make_config([{"name": "w0", "url": fake_server(FakeWorker(model="m")).url, "model": "m",
                        "kv_budget_tokens": 1000}],
                      agents=[{"name": "crawl", "models": ["m"], "rpm": 2, "on_overload": "reject"}],
                      default_agent="crawl", admission={"kv_full_ratio": 0.8})  # fmt: skip
    state = MemoryFleetState(cfg.backends, cfg.gateway.health)
    held = asyncio.run(state.reserve("w0", 900))  # the worker is full: admission rejects
    gw = gateway_server(cfg, state=state)
    hi = [{"role": "user", "content": "hi"}]
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0) as client:
        for _ in range(4):
            with pytest.raises(openai.RateLimitError) as err:
                client.chat.completions.create(model="auto", messages=hi, max_tokens=4)
            assert err.value.code == "overloaded"  # never rate_limit_exceeded: the refusals took nothing
        asyncio.run(state.release(held))
        for _ in range(2):
            client.chat.completions.create(model="auto", messages=hi, max_tokens=4)
        with pytest.raises(openai.RateLimitError) as err:
            client.chat.completions.create(model="auto", messages=hi, max_tokens=4)
        assert err.value.code == "rate_limit_exceeded"  # the two served requests spent the minute
