"""Overload end to end: real loopback simulated workers and gateway, the openai SDK as the client,
3x the fleet's capacity (chimera_bench.overload, shortened). The interactive agent keeps its SLA;
batch agents are degraded or told to retry later; nothing answers 5xx, nothing hangs, no queued
request waits past its deadline, and the lowest priority progresses once the load drops."""

from __future__ import annotations

from collections.abc import Callable

from chimera_bench.overload import MODEL, PROFILE, Scenario, drive, read_queue_waits, scenario_config, summarize
from router.core.config import Config
from tests.conftest import ServerThread

Start = Callable[..., ServerThread]


async def test_interactive_keeps_its_sla_at_3x_capacity(sim_server: Start, gateway_server: Start,
                                                        tmp_path: object) -> None:  # fmt: skip
    s = Scenario(multiple=3.0, duration_s=6.0, drain_s=4.0, seed=1, speedup=0.25)
    urls = {f"w{i}": sim_server(model=MODEL, profile=PROFILE, speedup=s.speedup, kv_tokens=s.kv_tokens, seed=i).url
            for i in range(s.workers)}  # fmt: skip
    log = f"{tmp_path}/requests.jsonl"
    gw = gateway_server(Config.model_validate(scenario_config(s, urls, request_log=log)))
    outcomes = await drive(gw.url, s, request_timeout_s=30.0)
    gw.stop()  # flushes the request log
    r = summarize(s, outcomes, read_queue_waits(log))
    ui, batch, crawler, bulk = r["interactive"], r["batch"], r["crawler"], r["bulk"]
    assert ui["requests"] >= 15 and ui["sla_attainment"] >= 0.95, r
    assert all(a["5xx"] == 0 and a["other_errors"] == 0 for a in r.values()), r
    assert all(a["retry_after_present"] == a["rejected_429"] for a in r.values()), r
    assert batch["degraded"] > 0 and crawler["rejected_429"] > 0, r
    for a in (ui, bulk):  # queued requests: never held past the SLA deadline
        assert a["max_queue_wait_s"] <= a["deadline_s"] + 0.1 and a["max_429_latency_s"] <= a["deadline_s"] + 0.5, r
    assert bulk["drain_ok"] >= 1, r  # the lowest priority progresses when the load drops
