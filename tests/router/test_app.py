"""The HTTP edge over real loopback servers, called with the official openai SDK: the contract's
error table in OpenAI's envelope, agent resolution, body pass-through, headers, /metrics,
/fleet, /ready and the request log. Workers are the small fake from tests/e2e/fakes.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from router.core.config import Config
from router.state.memory import MemoryFleetState
from tests.conftest import ServerThread, make_config
from tests.e2e.fakes import FakeWorker

USER = [{"role": "user", "content": "a secret prompt text"}]
Gw = Callable[..., ServerThread]


def _sdk(url: str, key: str = "none", **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=10, **kw)


@pytest.fixture
def two_models(fake_server: Callable[[FakeWorker], ServerThread]) -> tuple[FakeWorker, FakeWorker, Config]:
    """Workers `small` and `big`; agent planner (key pk) may use both, coder (key ck) only small."""
    small, big = FakeWorker(model="small"), FakeWorker(model="big")
    cfg = make_config(
        [{"name": "s0", "url": fake_server(small).url, "model": "small"},
         {"name": "b0", "url": fake_server(big).url, "model": "big"}],
        agents=[{"name": "planner", "api_keys": ["pk"], "models": ["big", "small"], "sla": {"e2e_ms": 0.001}},
                {"name": "coder", "api_keys": ["ck"], "models": ["small"]}],
        max_body_bytes=2000,
    )  # fmt: skip
    return small, big, cfg


def test_success_carries_headers_usage_and_unknown_fields(gateway_server: Gw, two_models: Any) -> None:
    small, big, cfg = two_models
    gw = gateway_server(cfg)
    with _sdk(gw.url, "pk") as client:
        raw = client.chat.completions.with_raw_response.create(
            model="big", messages=USER, max_tokens=3,
            extra_body={"sim": {"output_tokens": 3}, "vendor_field": {"x": [1, 2]}, "temperature": 0.25},
            extra_headers={"X-Request-Id": "req-42"},
        )  # fmt: skip
    out = raw.parse()
    assert raw.headers["x-chimera-backend"] == "b0"
    assert raw.headers["x-chimera-policy"] == "round_robin"
    assert raw.headers["x-request-id"] == "req-42"
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (7, 3)
    got = big.received[0]
    assert got["sim"] == {"output_tokens": 3} and got["vendor_field"] == {"x": [1, 2]} and got["temperature"] == 0.25
    assert got["model"] == "big" and not small.received
    assert "authorization" not in big.headers[0]  # the caller's key never reaches a worker
    assert big.headers[0]["x-request-id"] == "req-42"


def test_a_backend_api_key_is_sent_to_that_worker_only(gateway_server: Gw, fake_server: Any) -> None:
    keyed, open_ = FakeWorker(model="small"), FakeWorker(model="big")
    cfg = make_config(
        [{"name": "s0", "url": fake_server(keyed).url, "model": "small", "api_key": "wk-1"},
         {"name": "b0", "url": fake_server(open_).url, "model": "big", "api_key": ""}],  # "": no key
        agents=[{"name": "planner", "api_keys": ["pk"], "models": ["big", "small"]}],
    )  # fmt: skip
    gw = gateway_server(cfg)
    with _sdk(gw.url, "pk") as client:
        client.chat.completions.create(model="small", messages=USER, max_tokens=1)
        client.chat.completions.create(model="big", messages=USER, max_tokens=1, stream=True).close()
    assert keyed.headers[0]["authorization"] == "Bearer wk-1"  # the worker's key, not the caller's pk
    assert "authorization" not in open_.headers[0]


def test_auto_and_agent_name_route_within_the_agent_models(gateway_server: Gw, two_models: Any) -> None:
    small, big, cfg = two_models
    gw = gateway_server(cfg)
    with _sdk(gw.url, "ck") as coder, _sdk(gw.url, "pk") as planner:
        for _ in range(4):
            r = coder.chat.completions.with_raw_response.create(model="auto", messages=USER, max_tokens=1)
            assert r.headers["x-chimera-backend"] == "s0"
        seen = {planner.chat.completions.with_raw_response.create(model="planner", messages=USER, max_tokens=1)
                .headers["x-chimera-backend"] for _ in range(4)}  # fmt: skip
    assert seen == {"s0", "b0"}
    assert len(big.received) == 2 and all(r["model"] == "big" for r in big.received)  # auto → the worker's model
    assert len(small.received) == 6 and all(r["model"] == "small" for r in small.received)


def test_error_table_in_openai_envelope(gateway_server: Gw, two_models: Any) -> None:
    small, big, cfg = two_models
    gw = gateway_server(cfg)
    with _sdk(gw.url, "ck") as client:
        with pytest.raises(openai.PermissionDeniedError) as denied:
            client.chat.completions.create(model="big", messages=USER)
        assert denied.value.code == "model_not_allowed" and denied.value.param == "model"
        with pytest.raises(openai.NotFoundError) as unknown:
            client.chat.completions.create(model="gpt-9", messages=USER)
        assert unknown.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="auto", messages=[])
        assert bad.value.param == "messages" and bad.value.type == "invalid_request_error"
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(model="auto", prompt="hi", max_tokens="ten")  # type: ignore[arg-type]
        assert bad.value.param == "max_tokens"
        with pytest.raises(openai.APIStatusError) as too_big:
            client.completions.create(model="auto", prompt="x" * 3000)
        assert too_big.value.status_code == 413 and too_big.value.code == "request_too_large"
    with _sdk(gw.url, "wrong") as client, pytest.raises(openai.AuthenticationError) as auth:
        client.models.list()
    assert auth.value.type == "authentication_error"
    assert not small.received and not big.received

    def envelope(r: httpx.Response, status: int) -> dict[str, Any]:
        assert r.status_code == status, r.text
        err: dict[str, Any] = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        return err

    hdr = {"authorization": "Bearer pk"}
    with httpx.Client(base_url=gw.url, headers=hdr) as h:
        assert envelope(h.post("/v1/chat/completions", content=b"{not json"), 400)["code"] == "invalid_json"
        assert envelope(h.post("/v1/chat/completions", json={"messages": USER}), 400)["param"] == "model"
        assert envelope(h.post("/v1/completions", json={"model": "auto"}), 400)["param"] == "prompt"
        assert envelope(h.post("/v1/completions", json={"model": 5, "prompt": "x"}), 400)["param"] == "model"
        chunked = h.post("/v1/completions", content=iter([b'{"prompt": "', b"x" * 3000, b'"}']))  # no Content-Length
        assert envelope(chunked, 413)["code"] == "request_too_large"
        assert envelope(h.post("/v1/chat/completions", json={"model": "auto", "messages": USER}, headers={
            "authorization": ""}), 401)["type"] == "authentication_error"  # fmt: skip
        assert envelope(h.get("/v1/nope"), 404)["code"] == "unknown_url"
        r = h.get("/v1/chat/completions")
        assert envelope(r, 405)["code"] == "method_not_allowed" and "POST" in r.headers["allow"]


def test_worker_4xx_passes_through_untouched_and_is_not_retried(gateway_server: Gw, fake_server: Any) -> None:
    a, b = FakeWorker(mode="status", status=400), FakeWorker(mode="status", status=400)
    cfg = make_config([{"name": "a", "url": fake_server(a).url, "model": "m"},
                       {"name": "b", "url": fake_server(b).url, "model": "m"}])  # fmt: skip
    gw = gateway_server(cfg)
    with _sdk(gw.url) as client, pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=USER)
    assert info.value.message.endswith("fake 400") and info.value.response.headers["x-chimera-backend"] == "a"
    assert len(a.received) + len(b.received) == 1


def test_503_when_no_worker_is_healthy(gateway_server: Gw, fake_server: Any) -> None:
    w = FakeWorker()
    cfg = make_config([{"name": "a", "url": fake_server(w).url, "model": "m"}],
                      health={"eject_after_failures": 1})  # fmt: skip
    state = MemoryFleetState(cfg.backends, cfg.gateway.health)
    asyncio.run(state.record_probe("a", False, None))
    gw = gateway_server(cfg, state=state)
    with _sdk(gw.url) as client, pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="auto", messages=USER)
    assert info.value.status_code == 503 and info.value.code == "no_healthy_worker"
    assert info.value.response.headers["retry-after"] == "1"
    r = httpx.get(gw.url + "/ready")
    assert r.status_code == 503 and r.json()["error"]["message"] == "no worker is healthy yet"
    asyncio.run(state.record_probe("a", True, None))  # it answered once, then failed: not "yet"
    asyncio.run(state.record_probe("a", False, None))
    r = httpx.get(gw.url + "/ready")
    assert r.status_code == 503 and r.json()["error"]["message"] == "no worker is healthy"
    assert httpx.get(gw.url + "/health").json() == {"status": "ok"}
    assert not w.received


def test_agent_resolution_without_keys(gateway_server: Gw, fake_server: Any) -> None:
    url = fake_server(FakeWorker(model="small")).url
    url2 = fake_server(FakeWorker(model="big")).url
    agents = [{"name": "chat", "models": ["small"]}, {"name": "planner", "models": ["big", "small"]}]
    backends = [{"name": "s", "url": url, "model": "small"}, {"name": "b", "url": url2, "model": "big"}]
    gw = gateway_server(make_config(backends, agents=agents, default_agent="chat"))
    with _sdk(gw.url) as default, _sdk(gw.url, default_headers={"X-Agent": "planner"}) as planner:
        assert [m.id for m in default.models.list()] == ["auto", "small"]
        assert [m.id for m in planner.models.list()] == ["auto", "big", "small"]
        assert planner.models.retrieve("big").id == "big" and default.models.retrieve("auto").id == "auto"
        with pytest.raises(openai.NotFoundError):  # served, but not this agent's
            default.models.retrieve("big")
        with pytest.raises(openai.PermissionDeniedError):
            default.chat.completions.create(model="big", messages=USER)
        assert planner.chat.completions.create(model="big", messages=USER).model == "big"
    with _sdk(gw.url, default_headers={"X-Agent": "ghost"}) as ghost, pytest.raises(openai.AuthenticationError):
        ghost.models.list()
        # `model: <agent>` names the agent where the caller named none
        r = default.chat.completions.with_raw_response.create(model="planner", messages=USER, max_tokens=1)
        assert r.headers["x-chimera-backend"] in ("s", "b")
        assert {default.chat.completions.create(model="planner", messages=USER).model for _ in range(4)} == {
            "small",
            "big",
        }  # planner's two models, not chat's one
        with pytest.raises(openai.NotFoundError):  # X-Agent names the caller: another agent is no model of its
            planner.chat.completions.create(model="chat", messages=USER)
        assert planner.chat.completions.create(model="planner", messages=USER).model in ("small", "big")
    gw2 = gateway_server(make_config(backends, agents=agents))  # no default_agent, no keys: X-Agent required
    with _sdk(gw2.url) as nobody:
        with pytest.raises(openai.AuthenticationError):
            nobody.models.list()
        with pytest.raises(openai.AuthenticationError):
            nobody.chat.completions.create(model="auto", messages=USER)
        assert nobody.chat.completions.create(model="chat", messages=USER).model == "small"  # ... or the model


def test_fleet_metrics_ready_and_request_log(gateway_server: Gw, two_models: Any, tmp_path: Path) -> None:
    cfg = two_models[2]
    log = tmp_path / "requests.jsonl"
    cfg = cfg.model_copy(
        update={
            "gateway": cfg.gateway.model_copy(
                update={
                    "request_log": str(log),
                    "health": cfg.gateway.health.model_copy(update={"probe_interval_s": 0.05}),
                }
            )
        }
    )
    gw = gateway_server(cfg, probe=True)
    deadline = time.monotonic() + 5
    while httpx.get(gw.url + "/ready").status_code != 200:
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.05)
    with _sdk(gw.url, "pk") as client:
        client.chat.completions.create(model="auto", messages=USER, max_tokens=2,
                                       extra_headers={"x-workflow-id": "wf-7", "x-workflow-stage": "2"})  # fmt: skip
        stream = client.chat.completions.create(model="small", messages=USER, max_tokens=4, stream=True,
                                                stream_options={"include_usage": True})  # fmt: skip
        assert len([c for c in stream if c.choices]) == 4
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-9", messages=USER)
    fleet = httpx.get(gw.url + "/fleet").json()
    assert fleet["state"] == "memory"
    assert [b["name"] for b in fleet["backends"]] == ["s0", "b0"]
    for b in fleet["backends"]:
        assert {
            "name",
            "model",
            "healthy",
            "inflight_requests",
            "inflight_tokens",
            "pending_prefill_tokens",
            "kv_budget_tokens",
            "kv_usage",
            "running",
            "waiting",
            "consecutive_failures",
            "metrics_age_s",
            "predicted_ttft_ms",
        } <= set(b)
        assert b["healthy"] and b["inflight_requests"] == 0 and b["inflight_tokens"] == 0
        assert b["pending_prefill_tokens"] == 0  # the streamed request's prompt left it at its first token
        assert 0 < b["predicted_ttft_ms"] < b["predicted_e2e_ms"] and b["predicted_tpot_ms"] > 0
    assert fleet["predicted_for"] == {"prompt_tokens": 1024, "output_tokens": 256, "by": "prior"}
    metrics = httpx.get(gw.url + "/metrics").text
    for name in ("chimera_requests_total{", "chimera_ttft_seconds_bucket{", "chimera_e2e_seconds_bucket{",
                 "chimera_sla_violations_total{", "chimera_backend_healthy{", "chimera_backend_inflight{",
                 "# TYPE chimera_prediction_error_ratio histogram"):  # fmt: skip
        assert name in metrics, name
    assert 'chimera_requests_total{agent="planner",backend="none",status="404"} 1.0' in metrics
    assert 'chimera_sla_violations_total{agent="planner",kind="e2e"} 2.0' in metrics
    gw.stop()  # the log is flushed on shutdown
    text = log.read_text()
    assert "secret prompt" not in text and "pk" not in text.replace('"pk"', "")  # neither prompts nor keys
    lines = [json.loads(x) for x in text.splitlines()]
    # A streamed request is logged when its stream ends, which may come after the next request's line.
    assert sorted(x["status"] for x in lines) == [200, 200, 404]
    plain = next(x for x in lines if x["status"] == 200 and not x["stream"])
    streamed = next(x for x in lines if x["status"] == 200 and x["stream"])
    # the workflow headers are logged with or without a predictor (`chimera predictor train` reads them)
    assert (plain["workflow_id"], plain["workflow_stage"]) == ("wf-7", 2)
    assert streamed["workflow_id"] is None
    for field in ("ts", "request_id", "agent", "model", "backend", "policy", "endpoint", "stream", "prompt_tokens",
                  "prompt_tokens_est", "completion_tokens", "max_tokens", "message_count", "ttft_s", "e2e_s",
                  "status", "attempts", "error", "fleet"):  # fmt: skip
        assert field in plain, field
    assert set(plain["fleet"]) >= {"inflight_requests", "inflight_tokens", "pending_prefill_tokens", "running",
                                   "waiting", "kv_usage"}  # fmt: skip
    assert plain["agent"] == "planner" and plain["attempts"] == 1 and plain["stream"] is False
    assert plain["prompt_tokens"] == 7 and plain["completion_tokens"] == 2  # the worker's usage
    assert streamed["stream"] is True and streamed["backend"] == "s0" and streamed["ttft_s"] > 0
    assert streamed["completion_tokens"] == 4 and streamed["e2e_s"] >= streamed["ttft_s"]


def test_a_worker_s_own_400_comes_in_the_gateway_s_envelope(gateway_server: Gw, sim_server: Any) -> None:
    """vLLM words its errors its own way ("type": "BadRequestError", "code": 400); the gateway keeps the message
    and param and answers with its own type and a string code, as for its own errors."""
    sim = sim_server(model="m", max_model_len=64)
    gw = gateway_server(make_config([{"name": "w", "url": sim.url, "model": "m", "max_model_len": 8192}]))
    direct = httpx.post(sim.url + "/v1/completions", json={"model": "m", "prompt": "w " * 60, "max_tokens": 20})
    assert direct.status_code == 400 and direct.json()["error"]["code"] == 400  # as vLLM answers
    r = httpx.post(gw.url + "/v1/completions", json={"model": "auto", "prompt": "w " * 60, "max_tokens": 20})
    assert r.status_code == 400 and r.headers["x-chimera-backend"] == "w"
    err = r.json()["error"]
    assert err == {"message": direct.json()["error"]["message"], "type": "invalid_request_error",
                   "param": direct.json()["error"]["param"], "code": "invalid_request"}  # fmt: skip
    with _sdk(gw.url) as client, pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="auto", prompt="w " * 60, max_tokens=20)
    assert "maximum context length" in info.value.message and info.value.code == "invalid_request"
