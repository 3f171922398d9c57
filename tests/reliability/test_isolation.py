"""Isolation and secrets: keys compared in constant time, an agent confined to its own models,
keys and prompt text absent from every log, the admin key on /fleet and /metrics, the audit line."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

import router.auth
from router.app import create_app
from router.audit import audit_line
from router.auth import AgentResolver
from router.requestlog import RequestRecord
from tests.conftest import ServerThread, make_config
from tests.e2e.fakes import FakeWorker, Receive, Send, _respond
from tests.reliability.fastworker import fast_client

Gw = Callable[..., ServerThread]
PLANNER_KEY, CODER_KEY = "sk-planner-7f3a9c21e4b84d0f", "sk-coder-19ab44e0c2d7f611"
ADMIN_KEY = "adm-55d0e1f2a9c34b7e"
SECRET_WORD = "zebrafinch7731"  # a prompt word no log line may hold


def _agents() -> list[dict[str, Any]]:
    return [{"name": "planner", "api_keys": [PLANNER_KEY], "models": ["m-small"]},
            {"name": "coder", "api_keys": [CODER_KEY], "models": ["m-big"]}]  # fmt: skip


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_every_key_is_compared_whichever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit: the number of constant-time comparisons does not depend on which key (if any)
    matched, so response time does not tell how far down the key list a guess got."""
    agents = [{"name": f"a{i}", "api_keys": [f"key-{i}-a", f"key-{i}-b"], "models": ["m"]} for i in range(5)]
    resolver = AgentResolver(make_config([{"name": "w", "url": "http://w:1", "model": "m"}], agents))
    calls = [0]
    original = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls[0] += 1
        return original(a, b)

    monkeypatch.setattr(router.auth.hmac, "compare_digest", counting)
    per_key: list[int] = []
    for key in ("key-0-a", "key-4-b", "key-2-a", "nope", "key-0-"):
        calls[0] = 0
        try:
            resolver.resolve(_bearer(key))
        except router.auth.Unauthorized:
            pass
        per_key.append(calls[0])
    assert per_key == [10] * 5


class EchoingWorker(FakeWorker):
    """Answers 500 with the caller's prompt in its error message (as some servers do): the gateway
    may tell the caller, but must not log it."""

    async def _answer(self, req: dict[str, Any], chat: bool, receive: Receive, send: Send) -> None:
        if self.mode == "echo500":
            text = json.dumps(req.get("messages") or req.get("prompt"))
            env = {"error": {"message": f"cannot serve {text}", "type": "x", "param": None, "code": None}}
            await _respond(send, 500, json.dumps(env).encode())
            return
        await super()._answer(req, chat, receive, send)


@pytest.fixture
def two_agents(gateway_server: Gw, fake_server: Any, tmp_path: Path) -> Iterator[tuple[str, Path, list[FakeWorker]]]:
    small, big = FakeWorker(model="m-small"), FakeWorker(model="m-big", mode="ok")
    echo = EchoingWorker(model="m-big", mode="echo500")
    backends = [{"name": "small", "url": fake_server(small).url, "model": "m-small"},
                {"name": "big", "url": fake_server(big).url, "model": "m-big"},
                {"name": "echo", "url": fake_server(echo).url, "model": "m-big"}]  # fmt: skip
    log_path = tmp_path / "requests.jsonl"
    cfg = make_config(backends, _agents(), policy="round_robin", request_log=str(log_path), max_attempts=1,
                      timeouts={"first_byte_s": 1, "between_chunks_s": 0.5, "response_s": 1})  # fmt: skip
    yield gateway_server(cfg).url, log_path, [small, big, echo]


def test_an_agent_never_reaches_another_agents_models(two_agents: tuple[str, Path, list[FakeWorker]]) -> None:
    url, _, (small, big, _echo) = two_agents
    chat = "/v1/chat/completions"
    msg = [{"role": "user", "content": "hi"}]
    with httpx.Client(base_url=url, timeout=10) as c:
        coder = _bearer(CODER_KEY)
        # the other agent's model, by name: 403 (served, not allowed)
        r = c.post(chat, json={"model": "m-small", "messages": msg}, headers=coder)
        assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
        # the other agent's *name* as model does not mean "route me like planner"
        r = c.post(chat, json={"model": "planner", "messages": msg}, headers=coder)
        assert r.status_code == 404
        # auto and its own name stay within its own models; an X-Agent header changes nothing
        for model in ("auto", "coder", "auto", "coder"):
            r = c.post(chat, json={"model": model, "messages": msg}, headers={**coder, "x-agent": "planner"})
            assert r.status_code in (200, 502) and r.headers["x-chimera-backend"] in ("big", "echo")
        assert small.received == []  # planner's worker never saw a coder request
        ids = [m["id"] for m in c.get("/v1/models", headers=coder).json()["data"]]
        assert ids == ["auto", "m-big"]
        ids = [m["id"] for m in c.get("/v1/models", headers=_bearer(PLANNER_KEY)).json()["data"]]
        assert ids == ["auto", "m-small"]
        assert c.get("/v1/models").status_code == 401
        r = c.post(chat, json={"model": "auto", "messages": msg}, headers=_bearer(PLANNER_KEY))
        assert r.status_code == 200 and r.headers["x-chimera-backend"] == "small"
    assert all(req["model"] == "m-big" for req in big.received)


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.audit: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = logging.Formatter("%(name)s %(levelname)s %(message)s").format(record)  # exc_info included
        self.lines.append(text)
        if record.name == "chimera.audit":
            self.audit.append(record.getMessage())


@pytest.fixture
def captured() -> Iterator[Capture]:
    handler, root = Capture(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)  # everything, httpx/httpcore wire logs included
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_keys_and_prompts_never_reach_logs_and_every_request_is_audited(
    two_agents: tuple[str, Path, list[FakeWorker]], captured: Capture
) -> None:
    url, log_path, (_small, _big, echo) = two_agents
    prompt = [{"role": "user", "content": f"the secret word is {SECRET_WORD}"}]
    sent = 0
    with httpx.Client(base_url=url, timeout=10) as c:
        for key in (CODER_KEY, PLANNER_KEY):
            for stream in (False, True):
                for _ in range(3):  # round robin over big/echo: answers and 502s (echoing the prompt)
                    c.post("/v1/chat/completions", json={"model": "auto", "messages": prompt, "stream": stream},
                           headers=_bearer(key))  # fmt: skip
                    sent += 1
        bad = [  # errors of every kind, each carrying the secret somewhere
            (_bearer(CODER_KEY), {"model": "m-small", "messages": prompt}),  # 403
            (_bearer(CODER_KEY + "x"), {"model": "auto", "messages": prompt}),  # 401, a near-miss key
            ({"authorization": f"Basic {PLANNER_KEY}"}, {"model": "auto", "messages": prompt}),  # 401
            (_bearer(PLANNER_KEY), {"model": "no-such-model", "messages": prompt}),  # 404
            (_bearer(PLANNER_KEY), {"model": "auto", "messages": prompt, "max_tokens": -1}),  # 400
        ]
        for headers, body in bad:
            assert c.post("/v1/chat/completions", json=body, headers=headers).status_code >= 400
            sent += 1
        r = c.post("/v1/chat/completions", content=f'{{"model": "auto", "{SECRET_WORD}"'.encode(),
                   headers=_bearer(PLANNER_KEY))  # fmt: skip
        assert r.status_code == 400
        sent += 1
        c.get("/metrics")
        c.get("/fleet")
    assert echo.received, "the echoing worker was reached"
    _wait_for_log(log_path, sent)
    request_log = log_path.read_text()
    everything = "\n".join(captured.lines) + request_log
    for secret in (PLANNER_KEY, CODER_KEY, SECRET_WORD, "secret word"):
        assert secret not in everything, f"{secret!r} leaked into the logs"
    assert any("ejected" in line or "HTTP Request" in line for line in captured.lines)  # logs were captured
    # one audit line per completion request, with what an auditor needs
    assert len(captured.audit) == sent
    lines = [json.loads(a) for a in captured.audit]
    assert all(set(a) >= {"request_id", "agent", "model", "backend", "status", "attempts", "e2e_ms"} for a in lines)
    assert {a["agent"] for a in lines} == {"coder", "planner", None}  # None: the 401s
    assert {a["status"] for a in lines} >= {200, 400, 401, 403, 404, 502}


def _wait_for_log(path: Path, lines: int) -> None:
    import time

    deadline = time.monotonic() + 5
    while not path.exists() or len(path.read_text().splitlines()) < lines:
        assert time.monotonic() < deadline, "the request log was not flushed"
        time.sleep(0.05)


def test_audit_line_is_one_json_line_whatever_the_model_name() -> None:
    rec = RequestRecord(request_id="r1", endpoint="chat", requested_model='evil\n{"agent": "admin"}\u2028' + "x" * 500)
    rec.agent, rec.status, rec.attempts, rec.e2e_s = "coder", 404, 0, 0.0123
    line = audit_line(rec)
    assert "\n" not in line and "\u2028" not in line and len(line) < 400
    data = json.loads(line)
    assert data["agent"] == "coder" and data["e2e_ms"] == 12.3 and data["model"].startswith("evil\n")


@pytest.mark.parametrize("admin_key", [ADMIN_KEY, None])
def test_admin_key_guards_fleet_and_metrics_only(admin_key: str | None) -> None:
    cfg = make_config([{"name": "w", "url": "http://w.invalid:1", "model": "m-small"},
                       {"name": "b", "url": "http://b.invalid:1", "model": "m-big"}],
                      _agents(), admin_key=admin_key)  # fmt: skip
    with TestClient(create_app(cfg, http_client=fast_client(), probe=False)) as c:
        for path in ("/fleet", "/metrics"):
            for headers in ({}, _bearer(PLANNER_KEY), _bearer(ADMIN_KEY + "0"), {"authorization": ADMIN_KEY}):
                r = c.get(path, headers=headers)
                if admin_key is None:
                    assert r.status_code == 200
                    continue
                assert r.status_code == 401, (path, headers)
                err = r.json()["error"]
                assert set(err) == {"message", "type", "param", "code"} and err["type"] == "authentication_error"
                assert ADMIN_KEY not in r.text
            assert c.get(path, headers=_bearer(ADMIN_KEY)).status_code == 200
        assert c.get("/health").status_code == 200  # probes need no key
        assert c.get("/ready").status_code in (200, 503)
        assert c.get("/openapi.json").status_code == 200
        # the admin key is no agent key
        r = c.post("/v1/completions", json={"model": "auto", "prompt": "x"}, headers=_bearer(ADMIN_KEY))
        assert r.status_code == 401
