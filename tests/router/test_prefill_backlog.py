"""A streamed prompt counts as its worker's prefill backlog from dispatch to its first token (/fleet)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import openai

from tests.conftest import ServerThread, make_config


def _worker(url: str) -> dict[str, Any]:
    backend: dict[str, Any] = httpx.get(url + "/fleet").json()["backends"][0]
    return backend


def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_a_prompt_is_pending_until_its_first_token(
    sim_server: Callable[..., ServerThread], gateway_server: Callable[..., ServerThread]
) -> None:
    # A 7B sim at a fifth of real time: a 6,000-word prompt takes ~2 s of wall time to prefill, then
    # 300 tokens decode for ~5 s more, so the stream is open on both sides of its first token.
    sim = sim_server(model="q7", profile="h200-qwen2.5-7b", speedup=0.2)
    gw = gateway_server(make_config([{"name": "w", "url": sim.url, "model": "q7"}]))
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
    prompt = " ".join(f"w{i % 97}" for i in range(6000))
    stream = client.chat.completions.create(
        model="q7", messages=[{"role": "user", "content": prompt}], max_tokens=300, stream=True,
        extra_body={"sim": {"output_tokens": 300}},
    )  # fmt: skip
    chunks = iter(stream)
    _until(lambda: _worker(gw.url)["inflight_requests"] == 1)
    before = _worker(gw.url)
    assert before["pending_prefill_tokens"] >= 5000  # the gateway's estimate of the prompt
    next(c for c in chunks if c.choices and c.choices[0].delta.content)  # the first token
    _until(lambda: _worker(gw.url)["pending_prefill_tokens"] == 0)
    assert _worker(gw.url)["inflight_requests"] == 1  # still decoding: only the prefill left the count
    assert sum(1 for _ in chunks) > 0
    _until(lambda: _worker(gw.url)["inflight_requests"] == 0)
