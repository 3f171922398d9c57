"""A broken worker against a real `chimera serve` (its own process, so its memory is its own): answers far past
``gateway.max_response_bytes``, an error body of 40 MB, an event that never ends, a ``[DONE]`` that is only text, an
answer trickled a byte every 0.1 s.
The worker is a fake (no real worker can be made to send these on cue), served over loopback like a real one."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.listen import free_port
from router.core.asgi import read_body, respond
from tests.conftest import ServerThread
from tests.security.serving import chimera_serve, rss_mb

BIG = 40 << 20  # what the broken worker sends, in 1 MiB pieces
PIECE = b"x" * (1 << 20)


async def broken_worker(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """By the request's model: ``huge`` a 40 MB JSON answer, ``huge5xx`` a 40 MB 500, ``endless`` one SSE event of
    40 MB with no blank line, ``fakedone`` a stream whose text says ``[DONE]`` and that then breaks off, ``trickle`` a
    byte every 0.1 s, ``dripstream`` an event every 0.1 s."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] in ("/health", "/metrics"):
        await respond(send, 200, b"", [(b"content-type", b"text/plain")])
        return
    model = json.loads(await read_body(receive) or b"{}")["model"]
    kind = b"text/event-stream" if model in ("endless", "fakedone", "dripstream") else b"application/json"
    status = 500 if model == "huge5xx" else 200
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]})
    if model == "trickle":  # a byte every 0.1 s, for ever: each within the between-chunk timeout
        await send({"type": "http.response.body", "body": b'{"x": "', "more_body": True})
        for _ in range(600):
            await asyncio.sleep(0.1)
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
        await send({"type": "http.response.body", "body": b'"}', "more_body": False})
        return
    if model == "dripstream":  # an event every 0.1 s, for ever: each within the between-chunk timeout
        event = {"choices": [{"index": 0, "delta": {"content": "x"}}]}
        for _ in range(600):
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                        "more_body": True})  # fmt: skip
            await asyncio.sleep(0.1)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        return
    if model == "fakedone":
        event = {"choices": [{"index": 0, "delta": {"content": "the stream ends with data: [DONE]"}}]}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                    "more_body": True})  # fmt: skip
        await send({"type": "http.response.body", "body": b"data: {\"choices\": [", "more_body": False})
        return
    head = b'data: {"x": "' if model == "endless" else b'{"error": {"message": "' if status == 500 else b'{"x": "'
    await send({"type": "http.response.body", "body": head, "more_body": True})
    for _ in range(BIG // len(PIECE)):
        await send({"type": "http.response.body", "body": PIECE, "more_body": True})
    await send({"type": "http.response.body", "body": b'"}}' if status == 500 else b'"}', "more_body": False})


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    tmp = tmp_path_factory.mktemp("broken")
    models = ["huge", "huge5xx", "endless", "fakedone", "trickle", "dripstream"]
    workers = [ServerThread(broken_worker, log_level="critical").start() for _ in models]  # (a URL is one backend's)
    port = free_port()
    backends = "".join(f"  - {{name: {m}, url: '{w.url}', model: {m}, kv_budget_tokens: 100000}}\n"
                       for m, w in zip(models, workers, strict=True))  # fmt: skip
    log = tmp / "gateway.log"
    cfg = tmp / "gw.yaml"
    cfg.write_text(
        f"gateway: {{port: {port}, policy: least_outstanding, default_agent: chat, max_attempts: 1,\n"
        "          timeouts: {response_s: 2, stream_s: 2},\n"
        f"          max_response_bytes: 4194304, max_event_bytes: 1048576, request_log: '{tmp}/requests.jsonl'}}\n"
        f"backends:\n{backends}agents:\n  - {{name: chat, models: [{', '.join(models)}]}}\n"
    )  # fmt: skip
    try:
        with chimera_serve(cfg, port, ready="/health", out=log) as (url, proc):
            yield url, proc, log
    finally:
        for w in workers:
            w.stop()


def ask(url: str, model: str, stream: bool = False) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=30)


def test_answers_past_the_caps_are_refused_without_holding_them(
    gateway: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    url, proc, _ = gateway
    idle = rss_mb(proc.pid)
    t0 = time.monotonic()
    huge = ask(url, "huge")
    assert huge.status_code == 502
    assert "more than 4194304 bytes (gateway.max_response_bytes)" in huge.json()["error"]["message"]
    error = ask(url, "huge5xx")  # only the head of an error's body is read, for its message
    assert error.status_code == 502 and len(error.content) < 2000
    endless = ask(url, "endless", stream=True)
    assert endless.status_code == 200
    last = endless.text.strip().splitlines()[-1]
    assert last.startswith("data: {") and "larger than 1048576 bytes (gateway.max_event_bytes)" in last
    assert time.monotonic() - t0 < 20
    assert rss_mb(proc.pid) - idle < 50


def test_a_done_in_the_text_is_not_the_end_of_the_stream(gateway: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    url, _, _ = gateway
    r = ask(url, "fakedone", stream=True)
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert "[DONE]" in events[0]  # the model's own text, relayed
    assert json.loads(events[-1][6:])["error"]["code"] == "upstream_error"  # then the stream broke: said so


def test_an_answer_trickled_byte_by_byte_ends_at_its_deadline(
    gateway: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    url, _, _ = gateway
    t0 = time.monotonic()
    r = ask(url, "trickle")
    assert r.status_code == 504 and "response_s" in r.json()["error"]["message"]
    assert time.monotonic() - t0 < 5



def test_a_stream_kept_open_event_by_event_ends_at_its_deadline(
    gateway: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    url, _, _ = gateway
    t0 = time.monotonic()
    r = ask(url, "dripstream", stream=True)
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert len(events) > 5 and "gateway.timeouts.stream_s" in events[-1]
    assert json.loads(events[-1][6:])["error"]["code"] == "upstream_timeout"
    assert time.monotonic() - t0 < 5
