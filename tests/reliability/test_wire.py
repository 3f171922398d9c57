"""The HTTP surface over real loopback: the OpenAPI description, a fuzz sample through uvicorn
(h11 parsing included), bodies streamed past the size limit, and clients that hang up mid-stream
at random points."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from starlette.testclient import TestClient

from router.app import create_app
from router.wire import HeadFirstProtocol
from tests.conftest import ServerThread, make_config
from tests.reliability.fastworker import fast_client
from tests.reliability.fuzzing import KEYS, envelope_problem
from tests.reliability.harness import SwitchableWorker, fleet
from tests.reliability.test_fuzz import MAX_BODY, check_answer, collect, fuzz_config

Gw = Callable[..., ServerThread]
AUTH = {"authorization": f"Bearer {KEYS['planner']}"}


def test_openapi_describes_every_route_and_the_openai_bodies() -> None:
    with TestClient(create_app(fuzz_config("round_robin", admin_key="adm"), http_client=fast_client(),
                               probe=False)) as c:  # fmt: skip
        doc = c.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{model}", "/v1/feedback",
                 "/health", "/ready", "/metrics", "/fleet"):  # fmt: skip
        assert path in doc["paths"], path
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("ChatCompletionRequest")
    assert {"400", "401", "403", "404", "413", "429", "502", "503", "504"} <= set(chat["responses"])
    schemas = doc["components"]["schemas"]
    assert schemas["ChatCompletionRequest"]["required"] == ["model", "messages"]
    assert schemas["CompletionRequest"]["required"] == ["model", "prompt"]
    assert set(schemas["ErrorEnvelope"]["properties"]["error"]["required"]) == {"message", "type", "param", "code"}
    assert doc["paths"]["/fleet"]["get"]["security"] == [{"adminKey": []}]
    assert doc["paths"]["/health"]["get"]["security"] == []  # probes need no key


def test_a_gateway_behind_a_path_prefix_serves_completions() -> None:
    """uvicorn --root-path /gw (behind a proxy that strips /gw) puts the prefix in scope["path"] and
    in scope["root_path"]: the completion routes and their request record must match the path
    below it (they answered 500 before)."""
    app = create_app(fuzz_config("round_robin"), http_client=fast_client(), probe=False)
    with ServerThread(app, root_path="/gw", http=HeadFirstProtocol) as gw, httpx.Client(base_url=gw.url) as c:
        r = c.post("/v1/completions", json={"model": "auto", "prompt": "hi"}, headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0
        assert c.get("/health").status_code == 200


def _gateway(gateway_server: Gw, **kwargs: Any) -> ServerThread:
    return gateway_server(fuzz_config("predictive"), http_client=fast_client(), **kwargs)


def test_fuzz_sample_over_loopback(gateway_server: Gw) -> None:
    gw = _gateway(gateway_server)
    sent = refused_by_client = 0
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        assert c.post("/v1/completions", json={"model": "auto", "prompt": "hi"}, headers=AUTH).status_code == 200
        for req in collect(300):
            try:
                r = c.request(req.method, req.path, headers=list(req.headers), content=req.body)
            except httpx.LocalProtocolError:  # a header h11 will not put on the wire
                refused_by_client += 1
                continue
            sent += 1
            check_answer(req, r)
    assert sent > 250, refused_by_client


def test_body_streamed_past_the_limit_is_413(gateway_server: Gw) -> None:
    gw = _gateway(gateway_server)

    def chunks() -> Iterator[bytes]:  # no content-length: the gateway counts as it reads
        yield b'{"model": "auto", "prompt": "'
        for _ in range(MAX_BODY // 1024 + 8):
            yield b"a" * 1024
        yield b'"}'

    r = httpx.post(gw.url + "/v1/completions", content=chunks(), headers=AUTH, timeout=10)
    assert r.status_code == 413 and envelope_problem(r) is None
    r = httpx.post(gw.url + "/v1/completions", content=b"x" * (MAX_BODY + 1), headers=AUTH, timeout=10)
    assert r.status_code == 413 and envelope_problem(r) is None


def test_clients_hanging_up_mid_stream_at_random_points(gateway_server: Gw, fake_server: Any) -> None:
    worker = SwitchableWorker(chunks=100, chunk_delay=0.01)
    gw = gateway_server(make_config([{"name": "w0", "url": fake_server(worker).url, "model": "m"}]))
    rng = random.Random(7)
    body = b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s") % (len(body), body)  # fmt: skip
    socks: list[socket.socket] = []
    for _ in range(30):
        s = socket.create_connection(("127.0.0.1", gw.port))
        s.sendall(request)
        socks.append(s)
    time.sleep(0.1)
    for s in rng.sample(socks, len(socks)):  # hang up in random order, each after a random read
        s.recv(rng.choice([1, 64, 512, 4096]))
        time.sleep(rng.uniform(0, 0.02))
        s.close()
    deadline = time.monotonic() + 5
    while fleet(gw.url)["backends"][0]["inflight_requests"] != 0:
        assert time.monotonic() < deadline, "reservations of hung-up clients were not released"
        time.sleep(0.05)
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'status="499"' in metrics and 'status="5' not in metrics
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200  # and the gateway serves on


class _QuickIdle(HeadFirstProtocol):
    idle_s = 0.4  # the gateway's protocol with the read deadline of a test (REQUEST_IDLE_S is 30 s)


def _recv_all(sock: socket.socket, within_s: float) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and how long that took."""
    sock.settimeout(within_s)
    t0, got = time.monotonic(), b""
    while chunk := sock.recv(4096):
        got += chunk
    return got, time.monotonic() - t0


def test_slow_clients_are_cut_off_after_the_read_deadline_and_slow_progress_is_not() -> None:
    """Slowloris: a head or a body trickled, or stopped half-way, holds no socket past the deadline."""
    cfg = fuzz_config("round_robin")
    with ServerThread(create_app(cfg, http_client=fast_client(), probe=False), http=_QuickIdle) as gw:
        addr = ("127.0.0.1", gw.port)
        with socket.create_connection(addr) as s:  # half a head, then silence: 408, closed
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
            got, took = _recv_all(s, 5)
        assert got.startswith(b"HTTP/1.1 408") and 0.3 < took < 2, (got, took)
        with socket.create_connection(addr) as s:  # nothing at all: closed
            got, took = _recv_all(s, 5)
        assert took < 2
        with socket.create_connection(addr) as s:  # a head trickled a byte every 0.05 s: 408 at the head's deadline
            t0 = time.monotonic()
            try:
                for byte in b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n" + b"x-pad: " + b"p" * 100:
                    s.sendall(bytes([byte]))
                    time.sleep(0.05)
            except (BrokenPipeError, ConnectionResetError):
                pass
            got, _ = _recv_all(s, 5)
        assert got.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 2, got
        body = b'{"model": "auto", "prompt": "hello there"}'
        head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"authorization: " + AUTH["authorization"].encode() + b"\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n")  # fmt: skip
        with socket.create_connection(addr) as s:  # the head, half the body, silence: closed
            s.sendall(head + body[:10])
            got, took = _recv_all(s, 5)
        assert got == b"" and 0.3 < took < 2, (got, took)
        with socket.create_connection(addr) as s:  # a byte every 0.05 s (2 s, five deadlines): it goes on
            s.sendall(head)
            for i in range(len(body)):
                time.sleep(0.05)
                s.sendall(body[i : i + 1])
            s.settimeout(5)
            answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        fleet_now = httpx.get(gw.url + "/fleet").json()
        assert all(b["inflight_requests"] == 0 for b in fleet_now["backends"])
