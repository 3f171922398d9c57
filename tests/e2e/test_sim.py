"""The gateway in front of simulated vLLM workers, driven by the official openai SDK (sync, async,
streaming): what a multi-agent app pointed at chimera-router sees."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import openai

from tests.conftest import ServerThread, make_config

Start = Callable[..., ServerThread]
USER = [{"role": "user", "content": "write a haiku about routers"}]


def test_sync_chat_keeps_usage_and_routes_auto(sim_server: Start, gateway_server: Start) -> None:
    w = sim_server(model="qwen2.5-0.5b")
    gw = gateway_server(make_config([{"name": "w0", "url": w.url, "model": "qwen2.5-0.5b"}]))
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=USER, max_tokens=50, extra_body={"sim": {"output_tokens": 12}}
        )
        out = raw.parse()
        assert raw.headers["x-chimera-backend"] == "w0" and raw.headers["x-chimera-policy"] == "round_robin"
        assert out.model == "qwen2.5-0.5b"
        assert out.usage is not None and out.usage.completion_tokens == 12 and out.usage.prompt_tokens > 0
        text = client.completions.create(model="qwen2.5-0.5b", prompt="1 2 3", max_tokens=5, extra_body={
            "ignore_eos": True})  # fmt: skip
        assert text.usage is not None and text.usage.completion_tokens == 5


def test_stream_arrives_chunk_by_chunk(sim_server: Start, gateway_server: Start) -> None:
    w = sim_server(model="qwen2.5-0.5b", speedup=0.25)  # ~10 ms per token
    gw = gateway_server(make_config([{"name": "w0", "url": w.url, "model": "qwen2.5-0.5b"}]))
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0) as client:
        t0 = time.monotonic()
        stamps: list[float] = []
        usage = None
        for chunk in client.chat.completions.create(
            model="auto", messages=USER, max_tokens=40, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        ):  # fmt: skip
            stamps.append(time.monotonic() - t0)
            usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens == 40
    assert len(stamps) >= 40
    # the first tokens reached the client long before the worker finished generating
    assert stamps[-1] - stamps[0] > 0.2, stamps


async def test_async_clients_across_two_models(sim_server: Start, gateway_server: Start) -> None:
    small, big = sim_server(model="qwen2.5-0.5b"), sim_server(model="qwen2.5-7b", profile="h200-qwen2.5-7b")
    cfg = make_config(
        [{"name": "small-0", "url": small.url, "model": "qwen2.5-0.5b"},
         {"name": "big-0", "url": big.url, "model": "qwen2.5-7b"}],
        agents=[{"name": "planner", "api_keys": ["pk"], "models": ["qwen2.5-7b", "qwen2.5-0.5b"]},
                {"name": "tester", "api_keys": ["tk"], "models": ["qwen2.5-0.5b"]}],
        policy="least_outstanding",
    )  # fmt: skip
    gw = gateway_server(cfg)

    async def one(client: openai.AsyncOpenAI, stream: bool) -> tuple[str, str]:
        if stream:
            chunks = [c async for c in await client.completions.create(
                model="auto", prompt="def f(x):", max_tokens=8, stream=True)]  # fmt: skip
            return chunks[0].model, "".join(c.choices[0].text for c in chunks if c.choices)
        out = await client.chat.completions.create(model="auto", messages=USER, max_tokens=8)
        return out.model, out.choices[0].message.content or ""

    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="pk", max_retries=0) as planner, \
            openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="tk", max_retries=0) as tester:  # fmt: skip
        results = await asyncio.gather(*(one(c, s) for c in (planner, tester) for s in (False, True) for _ in range(4)))
    planner_models = {m for m, _ in results[:8]}
    tester_models = {m for m, _ in results[8:]}
    assert planner_models == {"qwen2.5-7b", "qwen2.5-0.5b"}  # least_outstanding spreads the burst
    assert tester_models == {"qwen2.5-0.5b"}  # never a model the agent may not use
    assert all(text for _, text in results)


def test_killed_worker_is_retried_then_ejected(sim_server: Start, gateway_server: Start) -> None:
    a, b = sim_server(model="qwen2.5-0.5b"), sim_server(model="qwen2.5-0.5b")
    cfg = make_config([{"name": "a", "url": a.url, "model": "qwen2.5-0.5b"},
                       {"name": "b", "url": b.url, "model": "qwen2.5-0.5b"}])  # fmt: skip
    gw = gateway_server(cfg)
    a.stop()  # killed: connections are refused from now on
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0) as client:
        backends = [
            client.chat.completions.with_raw_response.create(model="auto", messages=USER, max_tokens=4)
            .headers["x-chimera-backend"] for _ in range(6)
        ]  # fmt: skip
    assert backends == ["b"] * 6
    fleet = {x["name"]: x for x in httpx.get(gw.url + "/fleet").json()["backends"]}
    assert not fleet["a"]["healthy"] and fleet["b"]["healthy"]  # passive health: 3 failures eject it
