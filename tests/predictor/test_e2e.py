"""A gateway with the predictive policy over two simulated workers, driven by the openai SDK."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ServerThread, make_config
from tests.redisutil import SHARED_URL, redis_prefix

__all__ = ["redis_prefix"]  # fixture

Start = Callable[..., ServerThread]


def test_predictive_gateway_routes_logs_predictions_and_takes_feedback(
    sim_server: Start, gateway_server: Start, tmp_path: Path
) -> None:
    small = sim_server(model="qwen2.5-0.5b", profile="h200-qwen2.5-0.5b")
    big = sim_server(model="qwen2.5-14b", profile="h200-qwen2.5-14b")
    log = tmp_path / "requests.jsonl"
    cfg = make_config(
        [{"name": "small", "url": small.url, "model": "qwen2.5-0.5b", "profile": "h200-qwen2.5-0.5b"},
         {"name": "big", "url": big.url, "model": "qwen2.5-14b", "profile": "h200-qwen2.5-14b"}],
        agents=[{"name": "coder", "models": ["qwen2.5-14b", "qwen2.5-0.5b"], "sla": {"e2e_ms": 60000}}],
        policy="predictive", default_agent="coder", request_log=str(log),
        policy_options={"latency_slack": 100.0, "wrong_answer_s": 0.0}, predictor={"refit_interval_s": 0},
    )  # fmt: skip
    gw = gateway_server(cfg)
    messages = [{"role": "user", "content": "implement a parser " * 40}]
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0) as client:
        backends, ids = [], []
        for stage in range(3):
            raw = client.chat.completions.with_raw_response.create(
                model="auto", messages=messages, max_tokens=64, stream=False, extra_body={"sim": {"output_tokens": 8}},
                extra_headers={"x-workflow-id": "wf-1", "x-workflow-stage": str(stage)},
            )  # fmt: skip
            assert raw.headers["x-chimera-policy"] == "predictive"
            assert raw.headers["x-chimera-reason"] == "predictive:slack"  # Chimera's rule: no expected cost to compare
            assert raw.headers["x-chimera-runner-up"] == "small" and "x-chimera-runner-up-dearer" not in raw.headers
            backends.append(raw.headers["x-chimera-backend"])
            ids.append(raw.headers["x-request-id"])
            messages = [*messages, {"role": "assistant", "content": raw.parse().choices[0].message.content or ""}]
    # Chimera's rule with a huge slack: the most capable model (the 14B's prior quality) wins while both meet the SLA
    assert backends == ["big"] * 3
    ok = httpx.post(gw.url + "/v1/feedback", json={"request_id": ids[0], "correct": True})
    assert ok.status_code == 200 and ok.json() == {"ok": True, "matched": True}
    assert httpx.post(gw.url + "/v1/feedback", json={"request_id": ids[0], "score": 3}).status_code == 400
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and log.read_text().count("\n") < 4:
        time.sleep(0.1)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    reqs = [r for r in lines if r.get("request_id") in ids and r.get("endpoint")]
    assert len(reqs) == 3
    for r in reqs:
        assert {"ttft_ms", "e2e_ms", "quality", "output_tokens"} <= set(r["predicted"])
        assert len(r["sketch"]) > 64  # the dense sketch, then the task's term ids
        assert r["fleet"]["profile"] == "h200-qwen2.5-14b"
    assert [r["workflow_stage"] for r in reqs] == [0, 1, 2]
    assert reqs[0]["fleet"]["prefix_share"] == 0.0 and reqs[2]["fleet"]["prefix_share"] > 0.5  # affinity
    assert {"type": "feedback", "request_id": ids[0], "score": 1.0}.items() <= next(
        r for r in lines if r.get("type") == "feedback"
    ).items()
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'chimera_prediction_error_ratio_count{target="e2e"} 3.0' in metrics


def test_every_routed_answer_says_why(sim_server: Start, gateway_server: Start, tmp_path: Path) -> None:
    """The answer's headers carry the figures the decision was made with, as the request log keeps them: the
    chosen worker's predicted e2e and quality, the runner-up's, and how much dearer its expected cost was."""
    small = sim_server(model="qwen2.5-0.5b", profile="h200-qwen2.5-0.5b")
    big = sim_server(model="qwen2.5-14b", profile="h200-qwen2.5-14b")
    log = tmp_path / "requests.jsonl"
    backends = [{"name": "small", "url": small.url, "model": "qwen2.5-0.5b"},
                {"name": "big", "url": big.url, "model": "qwen2.5-14b"}]  # fmt: skip
    agents = [{"name": "chat", "models": ["qwen2.5-0.5b", "qwen2.5-14b"], "sla": {"e2e_ms": 60000}}]
    gw = gateway_server(make_config(backends, agents, policy="predictive", default_agent="chat", request_log=str(log),
                                    policy_options={"wrong_answer_s": 4.0, "spread_margin": 0.0}))  # fmt: skip
    plain = gateway_server(make_config(backends, agents, policy="least_outstanding", default_agent="chat"))
    body = {"model": "auto", "messages": [{"role": "user", "content": "what is 2 + 2?"}], "max_tokens": 16}
    said = []
    for n in range(4):
        r = httpx.post(gw.url + "/v1/chat/completions", json={**body, "stream": n % 2 == 1})
        assert r.status_code == 200
        said.append(r.headers)
    for h in said:
        chosen = h["x-chimera-backend"]
        assert h["x-chimera-reason"] in ("predictive:fastest", "predictive:quality")
        assert h["x-chimera-runner-up"] == ({"small", "big"} - {chosen}).pop()
        e2e, runner_up = float(h["x-chimera-predicted-e2e-ms"]), float(h["x-chimera-runner-up-e2e-ms"])
        quality, runner_up_quality = float(h["x-chimera-predicted-quality"]), float(h["x-chimera-runner-up-quality"])
        assert 0 < e2e < 60000 and 0 < runner_up < 60000 and 0 < quality < 1 and 0 < runner_up_quality < 1
        assert (runner_up_quality > quality) == (chosen == "small")  # the 14B: the better answer, in more time
        dearer = float(h["x-chimera-runner-up-dearer"].rstrip("%")) / 100
        # with no spread the first choice has the least expected cost e2e + (1 - quality) x wrong_answer_s
        assert dearer >= 0
        cost = e2e + (1 - quality) * 4000
        # (from the headers' rounded figures: a quality to 0.01 moves an expected cost by up to 20 ms)
        assert dearer == pytest.approx((runner_up + (1 - runner_up_quality) * 4000) / cost - 1, rel=0.02, abs=0.01)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and log.read_text().count("\n") < 4:
        time.sleep(0.05)
    logged = {json.loads(line)["request_id"]: json.loads(line)["predicted"] for line in log.read_text().splitlines()}
    for h in said:
        p = logged[h["x-request-id"]]
        assert h["x-chimera-predicted-e2e-ms"] == f"{p['e2e_ms']:.0f}"
        assert h["x-chimera-runner-up-dearer"] == f"{p['cost_gap']:+.1%}"
    r = httpx.post(plain.url + "/v1/chat/completions", json=body)
    assert r.headers["x-chimera-reason"] == "least_outstanding"
    assert r.headers["x-chimera-runner-up"] == ({"small", "big"} - {r.headers["x-chimera-backend"]}).pop()
    assert not any(k.startswith("x-chimera-predicted") for k in r.headers)  # no predictor: no predictions


def test_replicas_on_redis_share_the_prefix_index(
    sim_server: Start, gateway_server: Start, tmp_path: Path, redis_prefix: str
) -> None:
    """A workflow's first stage through one replica, its next through another: the second replica
    knows which worker holds the context (its expected prefix share), though it never sent it."""
    small = sim_server(model="qwen2.5-0.5b", profile="h200-qwen2.5-0.5b")
    big = sim_server(model="qwen2.5-14b", profile="h200-qwen2.5-14b")
    logs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    backends = [
        {"name": "small", "url": small.url, "model": "qwen2.5-0.5b", "profile": "h200-qwen2.5-0.5b"},
        {"name": "big", "url": big.url, "model": "qwen2.5-14b", "profile": "h200-qwen2.5-14b"},
    ]
    agents = [{"name": "coder", "models": ["qwen2.5-14b", "qwen2.5-0.5b"], "sla": {"e2e_ms": 60000}}]
    state = f"{SHARED_URL}?prefix={redis_prefix}&sync_interval_s=0.05"
    configs = [
        make_config(
            backends,
            agents,
            policy="predictive",
            default_agent="coder",
            request_log=str(log),
            state=state,
            predictor={"refit_interval_s": 0},
            policy_options={"latency_slack": 100.0, "wrong_answer_s": 0.0},  # the most capable: "big"
        )
        for log in logs
    ]
    gws = [gateway_server(cfg) for cfg in configs]
    messages = [{"role": "user", "content": "implement a parser " * 40}]
    with openai.OpenAI(base_url=gws[0].url + "/v1", api_key="x", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=messages, max_tokens=16, extra_body={"sim": {"output_tokens": 8}}
        )
    first = raw.headers["x-chimera-backend"]
    messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content or ""})
    messages.append({"role": "user", "content": "now test it"})
    time.sleep(1.0)  # a few syncs (every 0.05 s): the news goes out with the first's, in with the second's
    with openai.OpenAI(base_url=gws[1].url + "/v1", api_key="x", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=messages, max_tokens=16, extra_body={"sim": {"output_tokens": 8}}
        )
    second = raw.headers["x-request-id"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and second not in logs[1].read_text():
        time.sleep(0.1)
    rec = next(json.loads(line) for line in logs[1].read_text().splitlines() if second in line)
    assert rec["backend"] == first and rec["fleet"]["prefix_share"] > 0.5


def test_predictive_learns_a_worker_slower_than_its_profile(sim_server: Start, gateway_server: Start) -> None:
    """Two workers the gateway believes alike (same model, same profile, speedup 0.5), one of them really
    running four times slower: the prior ties them, so the policy splits the first requests between them
    (``spread_margin``); the slow one's streamed timings against the prediction raise its ``tpot_bias``,
    and from its first answer on every request goes to the fast one. With ``latency_feedback: false`` the
    tie never breaks: both keep getting requests."""
    slow = sim_server(model="qwen2.5-1.5b", profile="h200-qwen2.5-1.5b", speedup=0.125)
    fast = sim_server(model="qwen2.5-1.5b", profile="h200-qwen2.5-1.5b", speedup=0.5)
    sim = {"profile": "h200-qwen2.5-1.5b", "speedup": 0.5}  # what the gateway believes (its prior's time scale)
    backends = [
        {"name": n, "url": s.url, "model": "qwen2.5-1.5b", "sim": sim} for n, s in (("slow", slow), ("fast", fast))
    ]

    def run(feedback: bool) -> tuple[list[str], dict[str, Any]]:
        # answers this short are mostly the wrong-answer term of the cost: a small one, so latency decides
        options = {"latency_feedback": feedback, "wrong_answer_s": 0.2}
        cfg = make_config(backends, policy="predictive", policy_options=options, predictor={"refit_interval_s": 0})
        gw = gateway_server(cfg)
        chosen = []
        with openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0) as client:
            for i in range(10):
                with client.chat.completions.with_streaming_response.create(
                    model="auto", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=24,
                    stream=True, extra_body={"sim": {"output_tokens": 24}},
                ) as raw:  # fmt: skip
                    chosen.append(raw.headers["x-chimera-backend"])
                    for _ in raw.iter_lines():
                        pass
        fleet = {b["name"]: b for b in httpx.get(gw.url + "/fleet").json()["backends"]}
        metrics = httpx.get(gw.url + "/metrics").text
        for name, b in fleet.items():  # the same ratios on /metrics
            line = f'chimera_backend_prediction_bias{{backend="{name}",target="tpot"}} '
            assert float(metrics.split(line)[1].split()[0]) == pytest.approx(b["tpot_bias"], rel=0.01)
        return chosen, fleet

    chosen, fleet = run(True)
    biases = {n: (b["ttft_bias"], b["tpot_bias"]) for n, b in fleet.items()}
    # the draw sends a tied request there within a few; once its bias is learned, its cost is out of the margin
    assert 1 <= chosen.count("slow") <= 3 and chosen[-4:] == ["fast"] * 4, (chosen, biases)
    assert fleet["slow"]["tpot_bias"] > 1.15 * fleet["fast"]["tpot_bias"], biases
    assert fleet["slow"]["predicted_tpot_ms"] > 1.1 * fleet["fast"]["predicted_tpot_ms"]  # /fleet corrects too
    chosen, fleet = run(False)
    assert set(chosen) == {"slow", "fast"} and fleet["slow"]["tpot_bias"] == 1.0
