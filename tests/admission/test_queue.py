"""The admission queue and controller on a real MemoryFleetState, without HTTP: priority order,
aging, deadlines, disconnects, reject, degrade, headroom."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from router.admission import AdmissionController, AdmissionQueue
from router.call import ProxyCall
from router.core.config import Config
from router.core.errors import Overloaded
from router.core.types import Decision, FleetSnapshot, RequestFeatures
from router.features import build_features, parse_body, reserved_tokens
from router.metrics import Metrics
from router.policies import basic
from router.requestlog import RequestRecord
from router.state.memory import MemoryFleetState


def config(**admission: Any) -> Config:
    agents = [
        {"name": "ui", "models": ["big", "small"], "priority": 0, "on_overload": "queue", "sla": {"ttft_ms": 5000}},
        {"name": "batch", "models": ["big", "small"], "priority": 5, "on_overload": "queue",
         "sla": {"e2e_ms": 5000}},
        {"name": "crawler", "models": ["big"], "priority": 5, "on_overload": "reject", "sla": {"e2e_ms": 5000}},
        {"name": "lite", "models": ["big", "small"], "priority": 5, "on_overload": "degrade"},
    ]  # fmt: skip
    return Config.model_validate({
        "gateway": {"admission": {"kv_full_ratio": 0.8, "aging_s": 1.0, "tick_s": 0.01, "degrade_max_tokens": 16,
                                  **admission}},
        "backends": [{"name": "w-big", "url": "http://127.0.0.1:9", "model": "big", "kv_budget_tokens": 1000},
                     {"name": "w-small", "url": "http://127.0.0.1:10", "model": "small", "kv_budget_tokens": 1000}],
        "agents": agents,
    })  # fmt: skip


class Rig:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.state = MemoryFleetState(cfg.backends, cfg.gateway.health)
        self.metrics = Metrics()
        self.ctl = AdmissionController(cfg, self.state, basic.least_outstanding, self.metrics)

    def call(self, agent: str, model: str = "auto", max_tokens: int | None = 50,
             headers: dict[str, str] | None = None) -> ProxyCall:  # fmt: skip
        a = self.cfg.agent(agent)
        assert a is not None
        payload: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        if max_tokens is not None:
            payload["max_tokens"] = max_tokens
        parsed = parse_body("chat", payload)
        models = a.models if model == "auto" else (model,)
        f = build_features("chat", a, models, parsed, headers or {}, 0, prompt_tokens=5)  # the tests' arithmetic
        return ProxyCall("/v1/chat/completions", b"{}", payload, f, "rid", RequestRecord("rid", "chat"))

    async def fill(self, backend: str, tokens: int = 800) -> Any:
        return await self.state.reserve(backend, tokens)

    async def admit(self, call: ProxyCall) -> str:
        decision, _ = await self.ctl.admit(call)
        await self.state.reserve(decision.ranked[0], reserved_tokens(call.features))  # as the proxy does, at once
        return decision.ranked[0]

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def feats(priority: int) -> RequestFeatures:
    return RequestFeatures(agent="a", endpoint="chat", models=("m",), prompt_tokens=1, max_tokens=1, stream=False,
                           priority=priority)  # fmt: skip


async def test_queue_orders_by_priority_then_arrival_and_ages() -> None:
    q = AdmissionQueue(aging_s=1.0)
    a = q.push(feats(5), 0.0, 0.0, 99)
    b = q.push(feats(0), 0.0, 1.0, 99)
    c = q.push(feats(0), 0.0, 2.0, 99)
    assert list(q) == [b, c, a]  # p0 first, FIFO within a priority
    d = q.push(feats(0), 0.0, 5.5, 99)  # a has waited 5.5 s: effective priority 5 - 5.5 < 0
    assert list(q) == [b, c, a, d]
    assert q.effective_priority(a, 5.5) == pytest.approx(-0.5)
    assert q.ahead(feats(0), 3.0) and not q.ahead(feats(0), 0.5)
    assert q.remove(b) and not q.remove(b) and len(q) == 3
    for w in (a, c, d):
        w.future.cancel()


async def test_room_admits_at_once_and_full_fleet_queues_until_a_release() -> None:
    rig = Rig(config())
    assert await rig.admit(rig.call("ui")) in ("w-big", "w-small")
    big, small = await rig.fill("w-big"), await rig.fill("w-small")
    task = asyncio.create_task(rig.admit(rig.call("ui")))
    await asyncio.sleep(0.05)
    assert not task.done() and len(rig.ctl.queue) == 1
    assert rig.sample("chimera_queue_depth", agent="ui") == 1
    await rig.state.release(small)
    rig.ctl.wake()
    assert await asyncio.wait_for(task, 1) == "w-small"
    assert len(rig.ctl.queue) == 0 and rig.sample("chimera_queue_depth", agent="ui") == 0
    assert rig.sample("chimera_queue_wait_seconds_count", agent="ui") == 1
    await rig.state.release(big)


async def test_woken_in_priority_order_and_a_newcomer_cannot_overtake() -> None:
    rig = Rig(config(aging_s=100.0))
    held = [await rig.fill("w-big"), await rig.fill("w-small")]
    order: list[str] = []

    async def go(agent: str, max_tokens: int = 500) -> None:  # 505 tokens: one fits in a freed worker
        await rig.admit(rig.call(agent, max_tokens=max_tokens))
        order.append(agent)

    batch = asyncio.create_task(go("batch"))
    await asyncio.sleep(0.02)
    ui = asyncio.create_task(go("ui"))
    await asyncio.sleep(0.02)
    await rig.state.release(held.pop())  # room for one: the more urgent ui goes first
    rig.ctl.wake()
    await asyncio.wait_for(ui, 1)
    assert order == ["ui"] and not batch.done()
    # a small newcomer would fit next to ui's request, but the queued batch request comes first
    late = asyncio.create_task(go("batch", max_tokens=50))
    await asyncio.sleep(0.05)
    assert not late.done() and len(rig.ctl.queue) == 2
    await rig.state.release(held.pop())
    rig.ctl.wake()
    await asyncio.wait_for(asyncio.gather(batch, late), 1)
    assert order == ["ui", "batch", "batch"]


async def test_aging_lets_the_lowest_priority_through_first_after_waiting() -> None:
    rig = Rig(config(aging_s=0.02))
    held = [await rig.fill("w-big"), await rig.fill("w-small")]
    order: list[str] = []

    async def go(agent: str) -> None:
        await rig.admit(rig.call(agent))
        order.append(agent)

    batch = asyncio.create_task(go("batch"))
    await asyncio.sleep(0.2)  # 10 aging periods: batch (priority 5) now ranks above a fresh ui request
    ui = asyncio.create_task(go("ui"))
    await asyncio.sleep(0.02)
    await rig.state.release(held.pop())
    rig.ctl.wake()
    await asyncio.wait_for(batch, 1)
    await rig.state.release(held.pop())
    await asyncio.wait_for(ui, 1)
    assert order == ["batch", "ui"]


async def test_deadline_expiry_is_a_429_with_retry_after_never_a_hang() -> None:
    rig = Rig(config())
    await rig.fill("w-big"), await rig.fill("w-small")
    call = rig.call("ui", headers={"x-slo-ttft-ms": "150"})  # a caller may tighten its SLA
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(Overloaded) as err:
        await rig.ctl.admit(call)
    assert 0.1 < loop.time() - t0 < 0.5
    assert err.value.code == "queue_timeout" and int(err.value.headers()["Retry-After"]) >= 1
    assert len(rig.ctl.queue) == 0 and call.record.queue_wait_s is not None
    assert rig.sample("chimera_rejections_total", agent="ui", reason="queue_timeout") == 1


async def test_a_disconnected_client_leaves_the_queue() -> None:
    rig = Rig(config())
    await rig.fill("w-big"), await rig.fill("w-small")
    task = asyncio.create_task(rig.ctl.admit(rig.call("ui")))
    await asyncio.sleep(0.05)
    assert len(rig.ctl.queue) == 1
    task.cancel()  # what the proxy does when the client hangs up
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(rig.ctl.queue) == 0 and rig.sample("chimera_queue_depth", agent="ui") == 0
    await rig.ctl.close()


async def test_reject_answers_429_at_once() -> None:
    rig = Rig(config())
    await rig.fill("w-big")
    with pytest.raises(Overloaded) as err:
        await rig.ctl.admit(rig.call("crawler"))
    assert err.value.status_code == 429 and err.value.code == "overloaded"
    assert rig.sample("chimera_rejections_total", agent="crawler", reason="overloaded") == 1


async def test_degrade_caps_max_tokens_or_moves_to_a_smaller_model() -> None:
    rig = Rig(config())
    await rig.fill("w-big", 700)  # priority 5 may fill 0.8 x 0.75 = 600 of 1000: full for lite
    call = rig.call("lite", model="big", max_tokens=50)
    decision, _ = await rig.ctl.admit(call)  # the small model has room: moved there, answer kept
    assert (decision.ranked[0], call.degraded, call.features.max_tokens) == ("w-small", "model=small", 50)
    assert call.payload["model"] == "big" and b'"model":"small"' in call.body_for("small")
    call = rig.call("lite", model="small", max_tokens=100)
    await rig.fill("w-small", 520)
    decision, _ = await rig.ctl.admit(call)
    assert call.degraded == "max_tokens=16" and call.payload["max_tokens"] == 16
    assert b'"max_tokens":16' in call.body_for("small")
    assert rig.sample("chimera_degradations_total", agent="lite", kind="max_tokens") == 1
    assert rig.sample("chimera_degradations_total", agent="lite", kind="model") == 1


async def test_urgent_priorities_keep_headroom() -> None:
    rig = Rig(config(priority_headroom=0.1))
    await rig.fill("w-big", 500), await rig.fill("w-small", 500)
    with pytest.raises(Overloaded):  # priority 5 may fill 0.8 x 0.5 = 400 tokens: full
        await rig.ctl.admit(rig.call("crawler"))
    assert await rig.admit(rig.call("ui")) in ("w-big", "w-small")  # priority 0: up to 800


async def test_a_predicted_sla_miss_on_a_loaded_worker_is_unservable() -> None:
    cfg = config()
    state = MemoryFleetState(cfg.backends, cfg.gateway.health)
    predicted_ms = {"ttft_ms": 100.0, "e2e_ms": 9000.0}

    def predictive(f: RequestFeatures, snap: FleetSnapshot) -> Decision:
        return Decision(tuple(b.name for b in snap.backends), "fake", dict(predicted_ms))

    ctl = AdmissionController(cfg, state, predictive, Metrics())
    rig = Rig(cfg)
    await ctl.admit(rig.call("batch"))  # idle workers: waiting would not help, so it is served
    await state.reserve("w-big", 10), await state.reserve("w-small", 10)
    with pytest.raises(Overloaded):  # e2e SLA 5000 ms, predicted 9000 ms on a busy worker
        await ctl.admit(rig.call("crawler"))
    predicted_ms["e2e_ms"] = 1000.0
    await ctl.admit(rig.call("crawler"))


async def test_a_request_no_worker_has_the_context_for_goes_at_once() -> None:
    """max_tokens beyond every worker's max_model_len: vLLM answers 400 at once, so admission neither answers
    429 (no retry would help) nor queues it (at the head it would hold up everything behind it)."""
    rig = Rig(config())
    await rig.fill("w-big"), await rig.fill("w-small")
    for agent in ("crawler", "batch"):  # reject, queue
        decision, _ = await asyncio.wait_for(rig.ctl.admit(rig.call(agent, max_tokens=10**9)), 1.0)
        assert decision.ranked and len(rig.ctl.queue) == 0


async def test_a_full_queue_makes_room_for_a_more_urgent_request() -> None:
    rig = Rig(config(max_queue=2))
    await rig.fill("w-big"), await rig.fill("w-small")
    low = [asyncio.create_task(rig.ctl.admit(rig.call("batch"))) for _ in range(2)]
    await asyncio.sleep(0.05)
    assert len(rig.ctl.queue) == 2
    urgent = asyncio.create_task(rig.ctl.admit(rig.call("ui")))
    await asyncio.sleep(0.05)
    done = [t for t in low if t.done()]
    assert len(done) == 1 and isinstance(done[0].exception(), Overloaded)  # the last batch entry: displaced
    assert done[0].exception().code == "queue_full"  # type: ignore[union-attr]
    assert not urgent.done() and len(rig.ctl.queue) == 2
    with pytest.raises(Overloaded) as err:  # a newcomer no more urgent than the last entry: 429 as before
        await rig.ctl.admit(rig.call("batch"))
    assert err.value.code == "queue_full"
    for t in (urgent, *low):
        t.cancel()
    await asyncio.gather(urgent, *low, return_exceptions=True)
    await rig.ctl.close()


async def test_degrading_neither_overtakes_the_more_urgent_nor_breaks_min_tokens() -> None:
    rig = Rig(config())
    await rig.fill("w-big", 550), await rig.fill("w-small", 550)
    waiting = asyncio.create_task(rig.ctl.admit(rig.call("ui", max_tokens=400)))  # p0 may fill 800: does not fit
    await asyncio.sleep(0.05)
    assert len(rig.ctl.queue) == 1
    with pytest.raises(Overloaded):  # capped to 16 it would fit p5's 600, but ui is queued ahead of it
        await rig.ctl.admit(rig.call("lite", max_tokens=100))
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    call = rig.call("lite", max_tokens=100)
    call.set_payload({**call.payload, "min_tokens": 50})
    await rig.ctl.admit(call)
    assert call.payload["max_tokens"] == 16 and call.payload["min_tokens"] == 16  # else vLLM's 400
    await rig.ctl.close()


async def test_retry_after_counts_the_queue_that_goes_first() -> None:
    """A rejected request's Retry-After includes the room the more urgent queued requests will take first
    (it was 1 s whatever the queue: clients that honour it came back again and again in vain)."""
    rig = Rig(config())
    await rig.fill("w-big"), await rig.fill("w-small")
    with pytest.raises(Overloaded) as err:
        await rig.ctl.admit(rig.call("crawler"))
    alone = int(err.value.headers()["Retry-After"])
    queued = [asyncio.create_task(rig.ctl.admit(rig.call("ui", max_tokens=500))) for _ in range(6)]
    await asyncio.sleep(0.05)
    assert len(rig.ctl.queue) == 6
    with pytest.raises(Overloaded) as err:
        await rig.ctl.admit(rig.call("crawler"))
    behind = int(err.value.headers()["Retry-After"])
    assert alone == 1 and behind >= 8, (alone, behind)  # ~3,000 tokens ahead on a 600-token room: 5 periods of 2 s
    for t in queued:
        t.cancel()
    await asyncio.gather(*queued, return_exceptions=True)
    await rig.ctl.close()


async def test_retry_after_prices_the_adaptive_ratio_that_refused() -> None:
    """With adaptive admission a rejected request's Retry-After is priced against the worker's own ratio, the one
    that refused it, not ``kv_full_ratio``: a worker whose ratio was cut to half has half the room, so the same
    queue ahead takes about twice as long to drain (priced at 0.8 it said the same wait as an uncut worker)."""
    from router.concurrency import WorkerLimit

    waits = {}
    for ratio in (None, 0.4):  # None: the ratio as it starts, kv_full_ratio
        rig = Rig(config(adaptive=True))
        assert rig.ctl.adaptive is not None
        if ratio is not None:
            for name in ("w-big", "w-small"):  # held where it is: never stepped during the test
                rig.ctl.adaptive.workers[name] = WorkerLimit(ratio, updated_at=math.inf)
        await rig.fill("w-big"), await rig.fill("w-small")
        queued = [asyncio.create_task(rig.ctl.admit(rig.call("ui", max_tokens=500))) for _ in range(6)]
        await asyncio.sleep(0.05)
        assert len(rig.ctl.queue) == 6
        with pytest.raises(Overloaded) as err:
            await rig.ctl.admit(rig.call("crawler"))
        waits[ratio] = int(err.value.headers()["Retry-After"])
        for t in queued:
            t.cancel()
        await asyncio.gather(*queued, return_exceptions=True)
        await rig.ctl.close()
    assert waits[0.4] >= 1.6 * waits[None] and waits[None] >= 8, waits
