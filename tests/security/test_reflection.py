"""What the gateway tells a caller, and logs, of the caller's own text and of its internals: a caller's text is
repeated cut short; a worker's address, a transport's words and a Redis password never reach an answer or a log."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from backends.listen import free_port, wait_ready
from tests.conftest import ServerThread, interrupt, make_config
from tests.e2e.fakes import FakeWorker

Start = Callable[..., ServerThread]
ROOT = Path(__file__).resolve().parents[2]
USER = [{"role": "user", "content": "x"}]


def test_a_callers_text_is_repeated_cut_short(gateway_server: Start, fake_server: Start, tmp_path: Path) -> None:
    worker = fake_server(FakeWorker(model="m"))
    log = tmp_path / "requests.jsonl"
    gw = gateway_server(make_config([{"name": "w", "url": worker.url, "model": "m"}], request_log=str(log)))
    huge = "m" * 1_000_000
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": huge, "messages": USER})
    assert r.status_code == 404 and len(r.content) < 1000
    assert "(1000000 characters)" in r.json()["error"]["message"]
    agent = "a" * 50_000
    keyed = gateway_server(make_config([{"name": "w", "url": worker.url, "model": "m"}],
                                       agents=[{"name": "chat", "models": ["m"]}]))  # fmt: skip
    r = httpx.post(keyed.url + "/v1/chat/completions", headers={"x-agent": agent},
                   json={"model": "m", "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
    assert r.status_code == 401 and len(r.content) < 1000
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (log.exists() and log.read_text()):
        time.sleep(0.05)
    (line,) = log.read_text().splitlines()
    assert len(line) < 2000 and json.loads(line)["requested_model"] == "m" * 256


def test_a_failed_worker_is_named_not_its_address(
    gateway_server: Start, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()  # nothing listens there
    gw = gateway_server(make_config([{"name": "gone", "url": f"http://127.0.0.1:{port}", "model": "m"}]))
    with caplog.at_level(logging.WARNING, logger="router.proxy"):
        r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "m", "messages": USER})
    assert r.status_code == 502
    message = r.json()["error"]["message"]
    assert message == "worker gone connection failed before the first byte"
    assert str(port) not in r.text
    assert any(str(port) in rec.getMessage() for rec in caplog.records)  # the operator's log has the detail


def test_the_state_urls_password_is_never_logged(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"gateway: {{port: {port}, state: 'redis://:s3cretpw@127.0.0.1:6379/0?prefix=pw-test', default_agent: chat}}\n"
        f"backends:\n  - {{name: w, url: 'http://127.0.0.1:{free_port()}', model: m, kv_budget_tokens: 1000}}\n"
        "agents:\n  - {name: chat, models: [m]}\n"
    )  # fmt: skip
    out = tmp_path / "serve.log"
    with out.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "router.cli", "serve", "--config", str(cfg)], cwd=ROOT,
                                stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", 40, proc=proc)
    finally:
        interrupt(proc)
    text = out.read_text()
    assert "chimera gateway on" in text and "redis://:***@127.0.0.1:6379/0" in text  # the start-up line, redacted
    assert "s3cretpw" not in text
