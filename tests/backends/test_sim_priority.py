"""vLLM's ``--scheduling-policy priority`` in the simulated worker: the waiting queue by (priority, arrival),
the preemption victim last in that order, and the API (the field taken under either policy, as vLLM 0.26)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from backends.sim.engine import Engine, Request, Status
from backends.sim.textgen import Answer
from backends.sim.waiting import PriorityQueue, make_queue
from router.core.errors import ProfileError
from tests.backends.test_sim_engine import run
from tests.backends.test_sim_server import metrics, sdk, words
from tests.conftest import ServerThread

MakeEngine = Callable[..., Engine]


def request(tag: int, priority: int, arrival: float, prompt: int = 20, out: int = 4) -> Request:
    ids = [tag * 1_000_000 + i for i in range(prompt)]
    return Request(f"r{tag}", ids, Answer(out, word_start=tag, marker=None), max_tokens=out, arrival=arrival,
                   priority=priority)  # fmt: skip


def test_the_priority_queue_orders_by_priority_then_arrival() -> None:
    q: PriorityQueue[Request] = PriorityQueue()
    a, b, c, d = request(1, 5, 0.0), request(2, 0, 1.0), request(3, 5, 2.0), request(4, 0, 0.5)
    for r in (a, b, c, d):
        q.append(r)
    assert list(q) == [d, b, a, c] and q[0] is d and len(q) == 4
    q.remove(b)
    assert list(q) == [d, a, c] and len(q) == 3
    assert q.popleft() is d and q.popleft() is a
    q.appendleft(a)  # a preempted request rejoins in its order, not at the front
    q.append(b)
    assert list(q) == [b, a, c]
    with pytest.raises(ValueError):
        q.remove(d)
    with pytest.raises(ProfileError, match="scheduling policy"):
        make_queue("lifo")


@pytest.mark.parametrize(("policy", "order"), [("fcfs", [1, 2, 3]), ("priority", [2, 3, 1])])
def test_waiting_requests_are_admitted_in_the_policys_order(make_engine: MakeEngine, policy: str,
                                                            order: list[int]) -> None:  # fmt: skip
    engine = make_engine(max_num_seqs=1, scheduling_policy=policy)
    reqs = [request(1, 5, 0.0), request(2, 0, 1.0), request(3, 1, 2.0)]
    for r in reqs:
        engine.enqueue(r)
    run(engine)
    done = sorted(reqs, key=lambda r: r.finished_at)  # one at a time: finished in the order admitted
    assert [int(r.request_id[1:]) for r in done] == order


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_preemption_takes_the_newest_or_the_least_urgent(make_engine: MakeEngine, policy: str) -> None:
    # 8 blocks: two 60-token prompts fit, their growth does not; the older request is the less urgent one
    engine = make_engine(kv_budget_tokens=16 * 8, scheduling_policy=policy)
    old, young = request(1, 5, 0.0, prompt=60, out=40), request(2, 0, 1.0, prompt=60, out=40)
    engine.enqueue(old)
    engine.enqueue(young)
    t = 0.0
    while engine.stats.preemptions == 0:
        t += engine.step(t).duration
    victim, kept = (young, old) if policy == "fcfs" else (old, young)
    assert victim.status is Status.WAITING and victim.num_computed == 0 and victim.block_ids == []
    assert kept.status is Status.RUNNING
    run(engine, t)
    assert old.status is young.status is Status.FINISHED and len(old.output) == len(young.output) == 40


def test_a_victim_scheduled_earlier_in_the_step_is_taken_back(make_engine: MakeEngine) -> None:
    # the less urgent request runs first (admitted first) and is scheduled in a step before the urgent one
    # needs a block: the preemption takes it out of that step again, its token back into the budget
    engine = make_engine(kv_budget_tokens=16 * 8, scheduling_policy="priority", step_time_s={"prefill_tokens": 1e-3})
    low, high = request(1, 5, 0.0, prompt=48, out=60), request(2, 0, 1.0, prompt=56, out=60)
    engine.enqueue(low)
    t = engine.step(0.0).duration
    engine.enqueue(high)
    while engine.stats.preemptions == 0:
        assert engine.running[0] is low
        batch = engine.step(t)
        t += batch.duration
    assert low.status is Status.WAITING and low.block_ids == [] and high.status is Status.RUNNING
    assert batch.requests == [high] and batch.num_new == [1]
    c = engine.profile.step_time
    assert batch.duration == pytest.approx(c.base + c.decode_seqs)  # one decode: the taken-back one not counted
    run(engine, t)
    assert low.status is high.status is Status.FINISHED and len(low.output) == 60


def test_an_fcfs_worker_ignores_a_priority_and_a_priority_worker_honours_it(
    sim_server: Callable[..., ServerThread],
) -> None:
    # vLLM 0.26 takes the field under fcfs and ignores it (checked on an H200); so does the sim
    fcfs = sim_server(model="m")
    prio = sim_server(model="m", speedup=0.25, scheduling_policy="priority", max_num_seqs=1)
    with sdk(fcfs) as client:
        assert client.completions.create(model="m", prompt="hi", max_tokens=2, extra_body={"priority": 3}).usage
        with pytest.raises(openai.BadRequestError, match="priority"):
            client.completions.create(model="m", prompt="hi", max_tokens=2, extra_body={"priority": "soon"})
    # one sequence at a time: a long answer holds the engine while a batch of priority-9 requests queue; an
    # urgent request sent last is served before all of them
    finished: list[str] = []

    def one(tag: str, priority: int, out: int = 10) -> None:
        with sdk(prio) as client:
            client.completions.create(model="m", prompt=words(8, tag), max_tokens=out,
                                      extra_body={"priority": priority, "ignore_eos": True})  # fmt: skip
            finished.append(tag)  # as the answer arrives (closing the client can wait behind other threads)

    def until(name: str, value: float) -> None:
        deadline = time.monotonic() + 10
        while metrics(prio)[name] < value:
            assert time.monotonic() < deadline, f"{name} never reached {value}"

    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(one, "head", 9, 400)  # ~4 s of decode at this speed: time to queue the rest, under load too
        until("vllm:num_requests_running", 1)
        batch = [pool.submit(one, f"b{k}", 9) for k in range(5)]
        until("vllm:num_requests_waiting", 5)
        urgent = pool.submit(one, "urgent", 0, 60)  # long enough that the head's thread has noted its answer
        until("vllm:num_requests_waiting", 6)
        for f in (first, *batch, urgent):
            f.result()
    assert finished[:2] == ["head", "urgent"] and len(finished) == 7
