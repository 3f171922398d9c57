"""Attacks by request head, against a real `chimera serve` on loopback (its own process, so its memory is its own):
a header far past ``gateway.max_header_bytes`` is answered 431 as it arrives, and the gateway does not grow."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import httpx
import pytest

from backends.listen import free_port
from tests.security.serving import chimera_serve, rss_mb, send_raw


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    tmp = tmp_path_factory.mktemp("headers")
    port, worker = free_port(), free_port()
    cfg = tmp / "gw.yaml"
    cfg.write_text(
        f"gateway: {{port: {port}, policy: least_outstanding, default_agent: chat, max_header_bytes: 16384}}\n"
        f"backends:\n  - {{name: w, url: 'http://127.0.0.1:{worker}', model: qwen2.5-0.5b, kv_budget_tokens: 100000,\n"
        "     sim: {profile: h200-qwen2.5-0.5b, speedup: 20}}\n"
        "agents:\n  - {name: chat, models: [qwen2.5-0.5b]}\n"
    )  # fmt: skip
    with chimera_serve(cfg, port) as served:
        yield served


def test_a_huge_header_is_431_as_it_arrives_and_costs_nothing(gateway: tuple[str, subprocess.Popen[bytes]]) -> None:
    """(What it costs other callers' latency: test_attack_suite.py, where nothing else runs.)"""
    url, proc = gateway
    idle = rss_mb(proc.pid)
    for _ in range(5):
        answer = send_raw(url, b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: ", total=32 << 20)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert b'"code": "request_header_fields_too_large"' in answer and b"16384 bytes" in answer
    assert rss_mb(proc.pid) - idle < 50  # it was never buffered
    assert httpx.get(url + "/health").status_code == 200


def test_many_headers_and_a_long_url_count_too(gateway: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, _ = gateway
    many = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(200))  # 20 KB in 200 small headers
    assert send_raw(url, b"GET /health HTTP/1.1\r\nhost: x\r\n" + many).startswith(b"HTTP/1.1 431 ")
    long_url = b"GET /health?" + b"q" * 20_000 + b" HTTP/1.1\r\nhost: x\r\n"
    assert send_raw(url, long_url).startswith(b"HTTP/1.1 431 ")
    # under the limit: served, on a connection that stays usable
    r = httpx.get(url + "/health", headers={f"x-h{i}": "v" * 100 for i in range(100)})
    assert r.status_code == 200


def test_a_head_past_the_limit_in_one_piece_never_reaches_the_app(gateway: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, _ = gateway
    body = b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}]}'
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nx-workflow-id: %s\r\n\r\n" % (len(body), b"w" * 40_000))  # fmt: skip
    answer = send_raw(url, head + body)
    assert answer.startswith(b"HTTP/1.1 431 ") and answer.count(b"HTTP/1.1") == 1  # one answer, then closed
