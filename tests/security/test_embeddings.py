"""Embeddings are GPU work: through a real gateway to a simulated pooling worker (`--runner pooling`), they take
from the agent's rate limit by their input's tokens, hold those tokens on the worker while they run, and under
admission control go only where there is room."""

from __future__ import annotations

import base64
import concurrent.futures
import struct
import time
from collections.abc import Callable

import httpx
import openai

from tests.conftest import ServerThread, make_config

Start = Callable[..., ServerThread]
MODEL = "embed-small"


def test_the_openai_sdk_gets_embeddings_and_a_generative_route_is_not_there(
    sim_server: Start, gateway_server: Start
) -> None:
    worker = sim_server(model=MODEL, runner="pooling")
    assert httpx.post(worker.url + "/v1/chat/completions", json={"model": MODEL, "messages": []}).status_code == 404
    gw = gateway_server(make_config([{"name": "e", "url": worker.url, "model": MODEL}]))
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused")
    got = client.embeddings.create(model=MODEL, input=["a red fox", "a red fox", "the sea"])
    a, b, c = (d.embedding for d in got.data)
    assert len(a) == 384 and a == b and a != c and abs(sum(x * x for x in a) - 1) < 1e-6
    assert got.usage.prompt_tokens == got.usage.total_tokens > 6
    small = client.embeddings.create(model=MODEL, input="hello", dimensions=8, encoding_format="base64")
    raw = base64.b64decode(str(small.data[0].embedding))
    assert len(struct.unpack("<8f", raw)) == 8  # little-endian float32, as vLLM packs them
    bad = httpx.post(gw.url + "/v1/embeddings", json={"model": MODEL})
    assert bad.status_code == 400 and bad.json()["error"]["param"]


def test_embeddings_take_their_tokens_from_the_rate_limit(sim_server: Start, gateway_server: Start) -> None:
    worker = sim_server(model=MODEL, runner="pooling")
    cfg = make_config([{"name": "e", "url": worker.url, "model": MODEL}],
                      agents=[{"name": "a", "api_keys": ["ka"], "models": [MODEL], "tpm": 1000}])  # fmt: skip
    gw = gateway_server(cfg)
    headers = {"authorization": "Bearer ka"}
    long_text = " ".join(["word"] * 600)
    assert httpx.post(gw.url + "/v1/embeddings", headers=headers, json={"model": MODEL, "input": long_text}).is_success
    over = httpx.post(gw.url + "/v1/embeddings", headers=headers, json={"model": MODEL, "input": long_text})
    assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limit_exceeded"
    assert httpx.post(gw.url + "/v1/embeddings", headers=headers, json={"model": MODEL, "input": "hi"}).is_success


def test_an_embedding_flood_is_held_to_the_workers_room(sim_server: Start, gateway_server: Start) -> None:
    # a slow worker (a prefill of 3,000 tokens takes a while at 1/50 of real time) with room for 4,000 tokens
    worker = sim_server(model=MODEL, runner="pooling", speedup=0.02, kv_tokens=8192)
    cfg = make_config([{"name": "e", "url": worker.url, "model": MODEL, "kv_budget_tokens": 8192}],
                      admission={"kv_full_ratio": 0.5})  # fmt: skip
    gw = gateway_server(cfg, probe=False)
    text = " ".join(["word"] * 3000)

    def embed() -> httpx.Response:
        return httpx.post(gw.url + "/v1/embeddings", json={"model": MODEL, "input": text}, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        first = pool.submit(embed)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the first holds its tokens on the worker while it runs
            (view,) = httpx.get(gw.url + "/fleet").json()["backends"]
            if view["inflight_requests"] == 1:
                break
            time.sleep(0.01)
        assert view["inflight_requests"] == 1 and view["inflight_tokens"] >= 3000
        refused = [f.result() for f in [pool.submit(embed) for _ in range(3)]]
        assert first.result().status_code == 200
    assert {r.status_code for r in refused} == {429}
    assert {r.json()["error"]["code"] for r in refused} == {"overloaded"} and refused[0].headers["retry-after"]
    (view,) = httpx.get(gw.url + "/fleet").json()["backends"]
    assert view["inflight_requests"] == 0 and view["inflight_tokens"] == 0  # released
    assert embed().status_code == 200  # room again
