"""Worker faults through a real gateway: retries before the first byte, broken streams, timeouts,
client disconnects. Fake workers produce the faults on cue; they also observe whether the gateway
abandoned (cancelled) the upstream request."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from backends.listen import free_port
from tests.conftest import ServerThread, make_config
from tests.e2e.fakes import FakeWorker

USER = [{"role": "user", "content": "hello"}]
Gw = Callable[..., ServerThread]
FAST = {"connect_s": 0.5, "first_byte_s": 0.5, "between_chunks_s": 0.4, "response_s": 0.5}


def _gateway(gateway_server: Gw, urls: list[str], **gateway: Any) -> ServerThread:
    backends = [{"name": f"w{i}", "url": u, "model": "m"} for i, u in enumerate(urls)]
    return gateway_server(make_config(backends, **{"timeouts": FAST, **gateway}))


def _sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=10)


def _inflight(gw: ServerThread) -> list[int]:
    return [b["inflight_requests"] for b in httpx.get(gw.url + "/fleet").json()["backends"]]


def _wait(cond: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize(
    ("fault", "stream"),
    [("refused", False), ("refused", True), ("500", False), ("500", True), ("garbage", False),
     ("stall", False), ("stall", True)],
)  # fmt: skip
def test_failure_before_first_byte_is_retried_on_another_worker(
    gateway_server: Gw, fake_server: Any, fault: str, stream: bool
) -> None:
    bad = {"refused": None, "500": FakeWorker(mode="status", status=500), "garbage": FakeWorker(mode="garbage"),
           "stall": FakeWorker(mode="stall")}[fault]  # fmt: skip
    good = FakeWorker()
    bad_url = f"http://127.0.0.1:{free_port()}" if bad is None else fake_server(bad).url
    gw = _gateway(gateway_server, [bad_url, fake_server(good).url])  # round robin: seq 0 → w0 (the bad one)
    with _sdk(gw.url) as client:
        raw = client.chat.completions.with_raw_response.create(model="m", messages=USER, stream=stream)
        if stream:
            assert "".join(c.choices[0].delta.content or "" for c in raw.parse()) == "w0 w1 w2 w3 w4 "
        else:
            assert raw.parse().choices[0].message.content == "w0 w1 w2 w3 w4 "
    assert raw.headers["x-chimera-backend"] == "w1" and raw.headers["x-chimera-attempts"] == "2"
    assert len(good.received) == 1
    if fault == "stall":
        assert bad is not None and _wait(bad.abandoned.is_set)  # the stalled attempt was cancelled upstream
    assert _wait(lambda: _inflight(gw) == [0, 0])
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'chimera_worker_failures_total{backend="w0"' in metrics


@pytest.mark.parametrize(
    ("fault", "status", "exc"),
    [("500", 502, openai.InternalServerError), ("stall", 504, openai.InternalServerError)],
)
def test_every_attempt_failing_is_502_or_504(gateway_server: Gw, fake_server: Any, fault: str, status: int,
                                              exc: type[Exception]) -> None:  # fmt: skip
    def make() -> FakeWorker:
        return FakeWorker(mode="status", status=500) if fault == "500" else FakeWorker(mode="stall")

    workers = [make() for _ in range(3)]
    gw = _gateway(gateway_server, [fake_server(w).url for w in workers], max_attempts=2)
    with _sdk(gw.url) as client, pytest.raises(exc) as info:
        client.chat.completions.create(model="m", messages=USER)
    err: Any = info.value
    assert err.status_code == status
    assert err.response.headers["x-chimera-attempts"] == "2" and "x-chimera-policy" in err.response.headers
    assert err.type == ("bad_gateway" if status == 502 else "gateway_timeout")
    assert sum(len(w.received) for w in workers) == 2  # max_attempts distinct workers, no more


@pytest.mark.parametrize("fault", ["die_mid", "stall_mid", "end_mid", "half_mid"])
def test_stream_breaking_mid_way_ends_with_an_error_event(gateway_server: Gw, fake_server: Any, fault: str) -> None:
    worker = FakeWorker(mode=fault, chunks=6, break_after=2)
    gw = _gateway(gateway_server, [fake_server(worker).url])
    got: list[str] = []
    t0 = time.monotonic()
    with _sdk(gw.url) as client, pytest.raises(openai.APIError) as info:
        for chunk in client.chat.completions.create(model="m", messages=USER, stream=True):
            got.append(chunk.choices[0].delta.content or "")
    assert got == ["w0 ", "w1 "]  # what arrived before the break was delivered
    assert time.monotonic() - t0 < 3  # ended, never hung
    body: Any = info.value.body
    assert body["type"] == ("gateway_timeout" if fault == "stall_mid" else "bad_gateway")
    # the raw bytes: whole events only, the last one OpenAI's envelope
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True},
                      timeout=5) as r:  # fmt: skip
        text = r.read().decode()
    assert r.status_code == 200 and text.endswith("\n\n")
    last = text.strip().split("\n\n")[-1]
    assert last.startswith('data: {"error": {"message"') and '"code": "upstream_' in last
    events = [e.removeprefix("data: ") for e in text.strip().split("\n\n")]
    assert all(isinstance(json.loads(e), dict) for e in events)  # whole events only: half of one is never forwarded
    assert _wait(lambda: _inflight(gw) == [0])
    if fault in ("end_mid", "half_mid"):  # a clean close without [DONE] is a cut-short answer, not a success
        assert "without data: [DONE]" in last
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'chimera_worker_failures_total{backend="w0",kind="WorkerProtocolError"} 2.0' in metrics, metrics


@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_cancels_the_upstream_request(gateway_server: Gw, fake_server: Any, stream: bool) -> None:
    worker = FakeWorker(mode="ok" if stream else "stall", chunks=200, chunk_delay=0.05)
    gw = _gateway(gateway_server, [fake_server(worker).url], timeouts={**FAST, "first_byte_s": 30, "response_s": 30})
    body = {"model": "m", "messages": USER, "stream": stream}
    with httpx.Client(timeout=httpx.Timeout(5, read=0.5)) as client:
        if stream:
            with client.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
                chunks = r.iter_bytes()  # (dropping this iterator would close the connection at once)
                assert next(chunks).startswith(b"data: ")
                assert _wait(lambda: _inflight(gw) == [1])
            # leaving the block closes the connection mid-stream
        else:
            with pytest.raises(httpx.ReadTimeout):
                client.post(gw.url + "/v1/chat/completions", json=body)
    assert _wait(worker.abandoned.is_set), "the worker never saw the gateway hang up"
    assert _wait(lambda: _inflight(gw) == [0])
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'status="499"' in metrics


def test_unstarted_stream_to_dead_worker_is_retried(gateway_server: Gw, fake_server: Any) -> None:
    """A worker killed between requests: connection refused, the stream starts on another."""
    victim, other = FakeWorker(), FakeWorker()
    v = fake_server(victim)
    gw = _gateway(gateway_server, [v.url, fake_server(other).url], policy="least_outstanding")
    v.stop()
    with _sdk(gw.url) as client:
        for _ in range(3):
            chunks = list(client.chat.completions.create(model="m", messages=USER, stream=True))
            assert len(chunks) == 5
    assert len(other.received) == 3


def test_client_hanging_up_while_sending_its_body(gateway_server: Gw, fake_server: Any) -> None:
    worker = FakeWorker()
    gw = _gateway(gateway_server, [fake_server(worker).url])
    with socket.create_connection(("127.0.0.1", gw.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"model\": ")  # fmt: skip
    assert _wait(lambda: 'status="499"' in httpx.get(gw.url + "/metrics").text)
    assert not worker.received
