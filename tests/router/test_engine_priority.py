"""The ``priority`` the gateway sends to workers that schedule by priority (router/priority.py): its value,
that only ``scheduling_policy: priority`` backends get it, that a caller's own is replaced there, and the flag reaching
the sims ``chimera serve`` starts and the vLLM servers ``chimera workers up`` starts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from backends.launcher import plan_workers
from router.core.config import EnginePriorityConfig
from router.core.types import RequestFeatures
from router.priority import make_priority
from router.serve import sim_command, sim_groups
from tests.conftest import ServerThread, make_config
from tests.e2e.fakes import FakeWorker

USER = [{"role": "user", "content": "hello there"}]


def features(priority: int) -> RequestFeatures:
    return RequestFeatures(agent="a", endpoint="chat", models=("m",), prompt_tokens=10, max_tokens=20, stream=False,
                           priority=priority)  # fmt: skip


def test_the_value_orders_by_level_then_age_then_remaining_work() -> None:
    now = [1000.0]
    prio = make_priority(EnginePriorityConfig(aging_s=5.0), clock=lambda: now[0])
    assert prio(features(1)) == 1000 + 200_000  # a level is 1,000; 1,000 s at 5 s a level: 200 levels
    assert prio(features(0)) < prio(features(1)) < prio(features(2))
    first = prio(features(2))
    now[0] += 5.0  # a request sent one aging period later counts one level less urgent
    assert prio(features(1)) == first
    assert prio(features(1), {"workflow_remaining_tokens": 500.0}) == first  # remaining work unused by default
    stjf = make_priority(EnginePriorityConfig(aging_s=5.0, tokens_per_level=250.0), clock=lambda: now[0])
    base = stjf(features(1))
    assert stjf(features(1), {"workflow_remaining_tokens": 500.0}) == base + 2000  # 2 levels for 500 tokens
    assert stjf(features(1), {"output_tokens": 9.0}) == base == stjf(features(1), None)


def test_only_priority_scheduled_workers_get_it(gateway_server: Callable[..., ServerThread],
                                                fake_server: Callable[[Any], ServerThread]) -> None:  # fmt: skip
    fcfs, prio = FakeWorker(model="m"), FakeWorker(model="m")
    cfg = make_config([{"name": "f", "url": fake_server(fcfs).url, "model": "m"},
                       {"name": "p", "url": fake_server(prio).url, "model": "m", "scheduling_policy": "priority"}],
                      agents=[{"name": "chat", "models": ["m"], "priority": 2}], default_agent="chat")  # fmt: skip
    gw = gateway_server(cfg)
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0, timeout=10) as client:
        before = time.time()
        for _ in range(2):  # round robin: one each
            client.chat.completions.create(model="m", messages=USER)
        client.chat.completions.create(model="m", messages=USER, extra_headers={"x-priority": "4"})  # -> f
        client.chat.completions.create(model="m", messages=USER, extra_headers={"x-priority": "4"})  # -> p
        client.chat.completions.create(model="m", messages=USER)  # -> f
        client.chat.completions.create(model="m", messages=USER, extra_body={"priority": -10**9})  # -> p: replaced
        after = time.time()
    assert all("priority" not in body for body in fcfs.received) and len(fcfs.received) == 3
    sent = [body["priority"] for body in prio.received]
    assert round(1000 * (2 + before / 5.0)) <= sent[0] <= round(1000 * (2 + after / 5.0))
    assert sent[1] - sent[0] == pytest.approx(2000, abs=1000 * (after - before) / 5.0 + 1)  # x-priority 4: 2 levels
    # a caller's own priority would outrank every agent's queue: the gateway's agent-level value replaces it
    assert round(1000 * (2 + before / 5.0)) <= sent[2] <= round(1000 * (2 + after / 5.0))


Start = Callable[..., ServerThread]


def test_a_priority_scheduled_sim_serves_what_the_gateway_sends(gateway_server: Start, sim_server: Start) -> None:
    # real sims of both policies behind the gateway: the priority one takes the gateway's value
    fcfs, prio = sim_server(model="m"), sim_server(model="m", scheduling_policy="priority")
    cfg = make_config([{"name": "f", "url": fcfs.url, "model": "m"},
                       {"name": "p", "url": prio.url, "model": "m", "scheduling_policy": "priority"}])  # fmt: skip
    gw = gateway_server(cfg)
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0, timeout=10) as client:
        backends = set()
        for _ in range(4):
            r = client.chat.completions.with_raw_response.create(model="m", messages=USER, max_tokens=3)
            backends.add(r.headers["x-chimera-backend"])
            assert r.parse().usage.completion_tokens == 3
    assert backends == {"f", "p"}


def test_serve_and_workers_up_start_workers_with_the_policy() -> None:
    sim, by = {"profile": "h200-qwen2.5-0.5b"}, "priority"
    cfg = make_config([
        {"name": "a", "url": "http://127.0.0.1:9001", "model": "a", "sim": sim, "gpu": 0, "scheduling_policy": by},
        {"name": "b", "url": "http://127.0.0.1:9002", "model": "b", "sim": sim, "gpu": 0, "scheduling_policy": by},
        {"name": "c", "url": "http://127.0.0.1:9003", "model": "c", "sim": sim},
        {"name": "v", "url": "http://127.0.0.1:9004", "model": "v", "scheduling_policy": "priority",
         "launch": {"hf_model": "/m/v", "kv_cache_gib": 1}},
        {"name": "w", "url": "http://127.0.0.1:9005", "model": "w", "launch": {"hf_model": "/m/w", "kv_cache_gib": 1}},
    ])  # fmt: skip
    shared, alone = sim_groups(cfg.backends)
    cmd = sim_command(*shared)
    assert cmd[cmd.index("--scheduling-policy") + 1] == "priority"
    assert "scheduling_policy=priority" in cmd[cmd.index("--also") + 1]
    assert "--scheduling-policy" not in sim_command(*alone)
    v, w = plan_workers(cfg, python="py", log_dir="/tmp", env={})
    assert v.argv[v.argv.index("--scheduling-policy") + 1] == "priority" and "--scheduling-policy" not in w.argv
