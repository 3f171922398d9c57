"""What the gateway tells a caller, and logs, of the caller's own text and of its internals: a caller's text is
repeated cut short; a worker's address, a transport's words and a Redis password never reach an answer or a log."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from backends.listen import free_port
from tests.conftest import ServerThread, make_config
from tests.e2e.fakes import FakeWorker
from tests.redisutil import RedisServer
from tests.security.serving import chimera_serve

Start = Callable[..., ServerThread]
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


SECRETS = {"redis": "redispw-7f3a9c", "alice": "alicekey-51be07", "bob": "bobkey-c4d2e8",
           "admin": "adminkey-90ab1f", "worker": "workerkey-3e6d55"}


def test_no_secret_reaches_a_log_line_or_an_answer(tmp_path: Path, sim_server: Start) -> None:
    """Every secret the config holds (the Redis password, agents' keys, the admin key, a worker's key), against
    every kind of answer (served, streamed, refused, failed, operator endpoints) and every log: the process's
    output (its start-up line, its warnings, the audit trail) and the request log."""
    redis_srv = RedisServer("--requirepass", SECRETS["redis"], client={"password": SECRETS["redis"]}).start()
    worker = sim_server(model="qwen2.5-0.5b", profile="h200-qwen2.5-0.5b")
    port, dead = free_port(), free_port()
    cfg, log = tmp_path / "c.yaml", tmp_path / "requests.jsonl"
    cfg.write_text(
        f"gateway: {{port: {port}, state: 'redis://:${{REDIS_PASSWORD}}@127.0.0.1:{redis_srv.port}/0',\n"
        f"          admin_key: '${{ADMIN_KEY}}', request_log: '{log}', policy: predictive}}\n"
        "backends:\n"
        f"  - {{name: w, url: '{worker.url}', model: qwen2.5-0.5b, kv_budget_tokens: 9999,\n"
        "     api_key: '${WORKER_KEY}'}\n"
        f"  - {{name: gone, url: 'http://127.0.0.1:{dead}', model: m2, kv_budget_tokens: 9999,\n"
        "     api_key: '${WORKER_KEY}'}\n"
        "agents:\n"
        "  - {name: alice, api_keys: ['${ALICE_KEY}'], models: [qwen2.5-0.5b]}\n"
        "  - {name: bob, api_keys: ['${BOB_KEY}'], models: [m2], rpm: 5}\n"
    )  # fmt: skip
    env = {"REDIS_PASSWORD": SECRETS["redis"], "ADMIN_KEY": SECRETS["admin"], "ALICE_KEY": SECRETS["alice"],
           "BOB_KEY": SECRETS["bob"], "WORKER_KEY": SECRETS["worker"]}  # fmt: skip
    out, answers = tmp_path / "serve.log", []
    alice, bob = {"authorization": "Bearer " + SECRETS["alice"]}, {"authorization": "Bearer " + SECRETS["bob"]}
    admin = {"authorization": "Bearer " + SECRETS["admin"]}
    try:
        with chimera_serve(cfg, port, out=out, env={**os.environ, **env}) as (url, _):
            chat = url + "/v1/chat/completions"
            with httpx.Client(timeout=30) as c:
                calls = [
                    ("POST", chat, alice, {"model": "auto", "messages": USER, "max_tokens": 8}),
                    ("POST", chat, alice, {"model": "auto", "messages": USER, "max_tokens": 8, "stream": True}),
                    ("POST", chat, {"authorization": "Bearer " + SECRETS["alice"][:-1]}, {"model": "auto"}),  # 401
                    ("POST", chat, {}, {"model": "auto", "messages": USER}),  # 401: no key
                    ("POST", chat, alice, {"model": "m2", "messages": USER}),  # 403/404: not alice's
                    ("POST", chat, alice, {"model": "auto", "messages": "x"}),  # 400
                    ("POST", chat, bob, {"model": "auto", "messages": USER}),  # 502: its worker is gone
                    ("POST", url + "/tokenize", alice, {"model": "auto", "prompt": "hi"}),
                    ("POST", url + "/v1/feedback", alice, {"request_id": "x", "correct": True}),
                    ("GET", url + "/fleet", {}, None), ("GET", url + "/fleet", admin, None),  # 401, then the fleet
                    ("GET", url + "/metrics", admin, None), ("GET", url + "/v1/models", alice, None),
                    ("GET", url + "/fleet", alice, None),  # an agent's key is not the admin key
                ]  # fmt: skip
                statuses = []
                for method, where, headers, body in calls:
                    r = c.request(method, where, headers=headers, json=body)
                    statuses.append(r.status_code)
                    answers.append(r.text + "".join(f"{k}: {v}" for k, v in r.headers.items()))
            assert statuses[:2] == [200, 200] and statuses[2:4] == [401, 401] and statuses[6] == 502, statuses
            assert statuses[9:11] == [401, 200] and statuses[13] == 401, statuses
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not (log.exists() and log.read_text().count("\n") >= 3):
                time.sleep(0.05)
    finally:
        redis_srv.remove()
    text = out.read_text()
    assert "chimera gateway on" in text and f"redis://:***@127.0.0.1:{redis_srv.port}/0" in text  # redacted
    assert '"agent":"alice"' in text  # the audit trail is in it
    for where, content in [("the gateway's output", text), ("the request log", log.read_text()),
                           *((f"answer {i}", a) for i, a in enumerate(answers))]:  # fmt: skip
        for name, secret in SECRETS.items():
            assert secret not in content, f"{name}'s secret in {where}"
