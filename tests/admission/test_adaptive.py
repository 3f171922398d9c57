"""Adaptive admission: each worker's concurrency limit moved by its KV use, its TTFT and its own queue."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

import httpx
import pytest

from router.concurrency import DECREASE, MAX_GROWTH, TTFT_DECREASE, AdaptiveLimits
from router.core.types import BackendView
from tests.conftest import ServerThread, make_config

Servers = Callable[..., ServerThread]
BUDGET = 10_000


def view(reserved: int, kv: float | None = 0.2, ttft: float | None = 0.05, waiting: int = 0) -> BackendView:
    return BackendView("w", "m", kv_budget_tokens=BUDGET, inflight_requests=max(1, reserved // 500),
                       inflight_tokens=reserved, kv_usage=kv, ttft_ewma_s=ttft, waiting=waiting)  # fmt: skip


def stepped(*views: BackendView, moved: list[tuple[str, float]] | None = None) -> AdaptiveLimits:
    limits = AdaptiveLimits(0.8, 0.8, 3.0, update_s=1.0, moved=(lambda w, x: moved.append((w, x))) if moved is not None
                            else None)  # fmt: skip
    for i, v in enumerate(views):
        limits.ratio(v, float(i))
    return limits


def test_reservations_that_fill_the_ratio_while_little_kv_is_used_get_more_room() -> None:
    w = stepped(view(8000, kv=0.2)).workers["w"]
    assert w.ratio == pytest.approx(0.8 * (1 + 0.5 * 0.6 / 0.8)) and w.why == "grow"  # half the room left
    w = stepped(view(8000, kv=0.0)).workers["w"]
    assert w.ratio == pytest.approx(0.8 * MAX_GROWTH)
    w = stepped(*[view(40_000, kv=0.1)] * 30).workers["w"]
    assert w.ratio == 4.0  # reservations may exceed the budget, up to a bound


def test_kv_use_over_the_target_cuts_the_ratio_in_proportion() -> None:
    w = stepped(view(8000, kv=1.0)).workers["w"]
    assert w.ratio == pytest.approx(0.8 * 0.8) and w.why == "kv"


def test_a_queue_of_its_own_or_a_slow_first_token_lowers_the_ratio() -> None:
    w = stepped(view(3000, waiting=3)).workers["w"]
    assert w.ratio == pytest.approx(0.8 * DECREASE) and w.why == "queue"
    w = stepped(view(3000, ttft=0.05), view(3000, ttft=0.2)).workers["w"]
    assert w.ratio == pytest.approx(0.8 * TTFT_DECREASE) and w.why == "ttft"
    w = stepped(view(3000, ttft=0.05), view(3000, ttft=0.14)).workers["w"]
    assert w.why == "hold"  # within the tolerance (3x)


def test_a_ratio_that_does_not_bind_holds_and_one_step_per_interval() -> None:
    moved: list[tuple[str, float]] = []
    limits = stepped(view(2000), moved=moved)
    assert limits.workers["w"].why == "hold" and not moved
    limits.ratio(view(8000), 0.5)  # within update_s of the last step: no step
    assert limits.workers["w"].why == "hold"
    limits.ratio(view(8000), 1.0)
    assert limits.workers["w"].why == "grow" and moved == [("w", limits.workers["w"].ratio)]


def test_the_idle_ttft_follows_a_worker_that_got_slower_for_good() -> None:
    limits = stepped(view(500, ttft=0.05), *[view(500, ttft=0.2)] * 200)
    assert limits.workers["w"].idle_ttft_s > 0.19


def _gauge(text: str, name: str, **labels: str) -> float | None:
    sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(sel)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


async def _burst(gw_url: str, sim_url: str, n: int) -> tuple[float, list[int], list[float], list[float]]:
    """``n`` answers of 300 tokens with ``max_tokens`` 2000 at once: the makespan, the statuses, and the worker's own
    waiting count and KV use as it went."""
    body = {"model": "m", "prompt": "w " * 300, "max_tokens": 2000, "sim": {"output_tokens": 300}}
    waiting, kv = [], []
    async with httpx.AsyncClient(timeout=60) as http:
        t0 = time.perf_counter()
        sent = [asyncio.create_task(http.post(gw_url + "/v1/completions", json=body)) for _ in range(n)]
        while not all(t.done() for t in sent):
            text = (await http.get(sim_url + "/metrics")).text
            waiting.append(_gauge(text, "vllm:num_requests_waiting", model_name="m") or 0.0)
            kv.append(_gauge(text, "vllm:kv_cache_usage_perc", model_name="m") or 0.0)
            await asyncio.sleep(0.05)
        took = time.perf_counter() - t0
        return took, [(await t).status_code for t in sent], waiting, kv


@pytest.mark.quiet  # (the sim's queue is part of what it checks: a starved engine loop lets it grow)
async def test_adaptive_admission_fills_the_kv_that_reservations_leave_idle(
    sim_server: Servers, gateway_server: Servers
) -> None:
    """Answers far shorter than their ``max_tokens``: the static ratio admits by reservations (prompt + max_tokens),
    about 3 at a time on a worker whose KV holds 13 such answers; adaptive admission moves the ratio up until the
    worker's own KV use nears the target. The burst ends sooner, the worker's own queue stays short, every answer
    arrives."""
    sim = sim_server(model="m", profile="h200-qwen2.5-0.5b", speedup=2.0, kv_tokens=8192)
    took, peak = {}, {}
    for adaptive in (False, True):
        cfg = make_config([{"name": "w", "url": sim.url, "model": "m", "kv_budget_tokens": 8192}],
                          health={"probe_interval_s": 0.1}, admission={"adaptive": adaptive})  # fmt: skip
        gw = gateway_server(cfg, probe=True)
        took[adaptive], statuses, waiting, kv = await _burst(gw.url, sim.url, 40)
        peak[adaptive] = max(kv)
        assert statuses == [200] * 40
        if adaptive:
            async with httpx.AsyncClient() as http:
                ratio = _gauge((await http.get(gw.url + "/metrics")).text, "chimera_admission_ratio", backend="w")
    assert took[True] < 0.7 * took[False], took
    assert max(waiting) <= 2 and 1.5 * peak[False] < peak[True] <= 0.95, (waiting, peak)
    assert ratio is not None and ratio > 0.8  # moved up from kv_full_ratio


async def test_a_less_urgent_agent_whose_share_of_the_ratio_binds_moves_it_up(
    sim_server: Servers, gateway_server: Servers
) -> None:
    """A priority-5 agent may fill 0.75 of a worker's ratio (``priority_headroom``): where its requests fill that
    share while the worker's KV is mostly idle, the ratio grows as it does for an urgent agent's, instead of holding
    with those requests refused below the binding point the urgent agents see."""
    sim = sim_server(model="m", profile="h200-qwen2.5-0.5b", speedup=2.0, kv_tokens=8192)
    cfg = make_config([{"name": "w", "url": sim.url, "model": "m", "kv_budget_tokens": 8192}],
                      [{"name": "batch", "models": ["m"], "priority": 5}], default_agent="batch",
                      health={"probe_interval_s": 0.1}, admission={"adaptive": True})  # fmt: skip
    gw = gateway_server(cfg, probe=True)
    body = {"model": "m", "prompt": "w " * 50, "max_tokens": 300, "sim": {"output_tokens": 40}}
    ratios: list[float] = []
    async with httpx.AsyncClient(timeout=60) as http:
        sent = [asyncio.create_task(http.post(gw.url + "/v1/completions", json=body)) for _ in range(200)]
        while not all(t.done() for t in sent):  # the ratio as it went (its feedback may cut it again at the end)
            text = (await http.get(gw.url + "/metrics")).text
            ratios.append(_gauge(text, "chimera_admission_ratio", backend="w") or 0.0)
            await asyncio.sleep(0.05)
        statuses = [(await t).status_code for t in sent]
    assert statuses == [200] * 200
    assert max(ratios) > 0.8, ratios
