"""One tenant against another through a real gateway on loopback: verdicts on another agent's answers, a request id
chosen to collide with another agent's, a priority that would outrank every agent."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.conftest import ServerThread, make_config

Start = Callable[..., ServerThread]
USER = [{"role": "user", "content": "what is 2 + 2?"}]


def test_an_agent_grades_only_its_own_answers(sim_server: Start, gateway_server: Start, tmp_path: Path) -> None:
    worker = sim_server(model="qwen2.5-0.5b", profile="h200-qwen2.5-0.5b")
    log = tmp_path / "requests.jsonl"
    cfg = make_config(
        [{"name": "w", "url": worker.url, "model": "qwen2.5-0.5b"}],
        agents=[{"name": "alice", "api_keys": ["ka"], "models": ["qwen2.5-0.5b"]},
                {"name": "mallory", "api_keys": ["km"], "models": ["qwen2.5-0.5b"]}],
        policy="predictive", request_log=str(log), predictor={"refit_interval_s": 0},
    )  # fmt: skip
    gw = gateway_server(cfg)
    alice, mallory = {"authorization": "Bearer ka"}, {"authorization": "Bearer km"}

    def ask(headers: dict[str, str], rid: str | None = None) -> str:
        extra = {"x-request-id": rid} if rid else {}
        r = httpx.post(gw.url + "/v1/chat/completions", headers={**headers, **extra},
                       json={"model": "auto", "messages": USER, "max_tokens": 4})  # fmt: skip
        assert r.status_code == 200
        return r.headers["x-request-id"]

    def grade(headers: dict[str, str], rid: str) -> httpx.Response:
        return httpx.post(gw.url + "/v1/feedback", headers=headers, json={"request_id": rid, "correct": True})

    mine = ask(alice)
    deadline = time.monotonic() + 5
    while (r := grade(alice, mine)).json().get("matched") is not True and time.monotonic() < deadline:
        time.sleep(0.05)  # (the answer is recorded as it ends, a moment after the client has it)
    assert r.status_code == 200 and r.json() == {"ok": True, "matched": True}
    stolen = grade(mallory, mine)
    assert stolen.status_code == 404 and stolen.json()["error"]["code"] == "request_not_found"
    # an id chosen to collide with alice's: mallory's request is served, but not learned from, and not gradable
    ask(alice, "shared-id-1")
    time.sleep(0.3)
    ask(mallory, "shared-id-1")
    time.sleep(0.3)
    assert grade(mallory, "shared-id-1").status_code == 404
    assert grade(alice, "shared-id-1").json()["matched"] is True
    time.sleep(0.6)  # the request log is written twice a second
    verdicts = [json.loads(line) for line in log.read_text().splitlines() if '"feedback"' in line]
    assert {(v["request_id"], v["agent"]) for v in verdicts} == {(mine, "alice"), ("shared-id-1", "alice")}


def test_every_path_to_a_worker_and_every_refusal_counts_against_the_rate_limit(
    sim_server: Start, gateway_server: Start
) -> None:
    worker = sim_server(model="qwen2.5-0.5b", profile="h200-qwen2.5-0.5b")
    cfg = make_config([{"name": "w", "url": worker.url, "model": "qwen2.5-0.5b"}],
                      agents=[{"name": "a", "api_keys": ["ka"], "models": ["qwen2.5-0.5b"], "rpm": 3},
                              {"name": "b", "api_keys": ["kb"], "models": ["qwen2.5-0.5b"], "rpm": 2}])  # fmt: skip
    gw = gateway_server(cfg)
    a, b = {"authorization": "Bearer ka"}, {"authorization": "Bearer kb"}
    # three refusals for what was sent (a model that is not there, a body that is not JSON): the minute is spent
    chat = gw.url + "/v1/chat/completions"
    assert httpx.post(chat, headers=a, json={"model": "nope", "messages": USER}).status_code == 404
    assert httpx.post(chat, headers=a, content=b"{not json").status_code == 400
    assert httpx.post(gw.url + "/v1/completions", headers=a, json={"model": "nope", "prompt": "x"}).status_code == 404
    over = httpx.post(chat, headers=a, json={"model": "auto", "messages": USER})
    assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(over.headers["retry-after"]) > 0
    # tokenize goes through the same buckets as completions
    tok = {"model": "qwen2.5-0.5b", "prompt": "hello there"}
    assert httpx.post(gw.url + "/tokenize", headers=b, json=tok).status_code == 200
    assert httpx.post(gw.url + "/tokenize", headers=b, json=tok).status_code == 200
    assert httpx.post(gw.url + "/tokenize", headers=b, json=tok).status_code == 429

    # verdicts have a bucket of their own, as many a minute as the agent's rpm: b's spent requests do not block them
    verdict = {"request_id": "made-up", "correct": True}
    statuses = [httpx.post(gw.url + "/v1/feedback", headers=b, json=verdict).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
