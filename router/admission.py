"""Admission control under overload: who is served now, who waits, who is degraded or told to retry.

A request is *servable now* when an eligible worker has room for it and, where the policy predicts
latency, the chosen worker is predicted to meet the request's SLA given the time it already
waited. A worker has room when its reservations (every replica's, plus grants not yet reserved)
with this request's stay within ``kv_full_ratio`` x its KV budget — lowered by
``priority_headroom`` per priority level, so urgent agents find room batch agents may not take —
and vLLM reports at most ``max_waiting`` waiting requests. An idle worker always has room. With ``adaptive`` each
worker has a ratio of its own in place of ``kv_full_ratio``, moved by feedback (:mod:`router.concurrency`).

A request that is not servable now, or that would overtake a more urgent queued request for the
same models, gets its agent's ``on_overload``:

``queue``    waits in one priority queue ordered by ``priority + enqueued_at / aging_s`` (a request
             gains a level per ``aging_s`` waited, so nothing starves) until capacity frees — a
             reservation released here (:meth:`AdmissionController.wake`) or a check every
             ``tick_s`` (probes, other replicas) — or until its deadline: the SLA budget left once
             the predicted service time is taken out (at most ``max_queue_wait_s``), then 429 with
             Retry-After. A client that hangs up leaves the queue (its task is cancelled).
``reject``   429 at once, Retry-After from the predicted drain time.
``degrade``  served smaller: a model later in the agent's ``models`` list (where it named one),
             ``max_tokens`` capped at ``degrade_max_tokens``, or both — the first servable now;
             else 429. The response says what in ``X-Chimera-Degraded``.

Grants do not race reservations: a grant holds its tokens on the worker until the woken request
runs, and the proxy reserves in the same synchronous step in which :meth:`admit` returns.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from router.call import ProxyCall
from router.concurrency import AdaptiveLimits
from router.core.config import AdmissionConfig, AgentConfig, Config
from router.core.errors import NoHealthyWorker, Overloaded
from router.core.types import BackendView, Decision, FleetSnapshot, Policy, RequestFeatures
from router.features import reserved_tokens
from router.metrics import Metrics
from router.state.base import FleetView

DEFAULT_OCCUPANCY_S = 2.0  # how long a request holds its reservation, before anything was measured
TYPICAL_OUTPUT_TOKENS = 150
MIN_LIMIT_SHARE = 0.25  # the least share of kv_full_ratio any priority may fill
MAX_RETRY_AFTER_S = 60.0


@dataclass(frozen=True, slots=True)
class Grant:
    """Where an admitted request goes: the policy's decision among the workers with room."""

    decision: Decision
    eligible: FleetSnapshot
    tokens: int  # what the proxy will reserve on decision.ranked[0]


class _Displaced(Exception):
    """A queued request's place was taken by a more urgent one while the queue was full."""


@dataclass(eq=False, slots=True)
class Waiter:
    features: RequestFeatures
    arrived: float  # the request's arrival (its SLA clock), in the controller's clock
    enqueued_at: float
    deadline: float
    key: float
    seq: int
    future: asyncio.Future[Grant]
    hold: tuple[str, int] | None = None  # (worker, tokens) granted but not yet reserved


class AdmissionQueue:
    """Queued requests, most urgent first. The order key ``priority + enqueued_at / aging_s`` is
    ``effective priority + now / aging_s`` at any instant (every entry ages at the same rate), so
    comparing keys compares effective priorities and the order never needs recomputing."""

    def __init__(self, aging_s: float) -> None:
        self.aging_s = aging_s
        self._items: list[Waiter] = []
        self._seq = itertools.count()

    def key(self, priority: float, at: float) -> float:
        return priority + at / self.aging_s

    def effective_priority(self, w: Waiter, now: float) -> float:
        return w.key - now / self.aging_s

    def push(self, features: RequestFeatures, arrived: float, now: float, deadline: float) -> Waiter:
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        w = Waiter(features, arrived, now, deadline, self.key(features.priority, now), next(self._seq), future)
        bisect.insort(self._items, w, key=lambda x: (x.key, x.seq))
        return w

    def tokens_ahead(self, features: RequestFeatures, now: float) -> int:
        """The reserved tokens of the queued requests more urgent now than ``features`` for one of its models."""
        key, models = self.key(features.priority, now), set(features.models)
        return sum(reserved_tokens(w.features) for w in self._items if w.key < key and models & set(w.features.models))

    def last(self) -> Waiter | None:
        """The least urgent entry."""
        return self._items[-1] if self._items else None

    def remove(self, w: Waiter) -> bool:
        with contextlib.suppress(ValueError):
            self._items.remove(w)
            return True
        return False

    def ahead(self, features: RequestFeatures, now: float) -> bool:
        """Whether a queued request for one of the same models is more urgent than this one now."""
        key, models = self.key(features.priority, now), set(features.models)
        for w in self._items:
            if w.key >= key:
                return False
            if models.intersection(w.features.models):
                return True
        return False

    def __iter__(self) -> Iterator[Waiter]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)


class AdmissionController:
    """One per gateway (``Gateway.admission``), when ``gateway.admission`` is configured."""

    def __init__(self, config: Config, state: FleetView, policy: Policy, metrics: Metrics, *,
                 clock: Callable[[], float] = time.perf_counter) -> None:  # fmt: skip
        assert config.gateway.admission is not None
        self.options: AdmissionConfig = config.gateway.admission
        self.config, self.state, self.policy, self.metrics, self.clock = config, state, policy, metrics, clock
        self.queue = AdmissionQueue(self.options.aging_s)
        self._held: dict[str, tuple[int, int]] = {}  # worker -> (requests, tokens) granted, not reserved
        self._ticker: asyncio.Task[None] | None = None
        o = self.options
        gauge = metrics.admission_ratio

        def moved(worker: str, ratio: float) -> None:
            gauge.labels(worker).set(ratio)

        interval = config.gateway.health.probe_interval_s
        self.adaptive = (AdaptiveLimits(o.kv_full_ratio, o.target_kv_usage, o.ttft_tolerance, interval, moved)
                         if o.adaptive else None)  # fmt: skip

    async def close(self) -> None:
        task, self._ticker = self._ticker, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the request path --

    async def admit(self, call: ProxyCall) -> tuple[Decision, FleetSnapshot]:
        """The decision and the workers it may use; may wait, may degrade ``call`` (its payload,
        features and ``degraded``), raises Overloaded (429) or NoHealthyWorker (503)."""
        f, now = call.features, self.clock()
        arrived = now - (time.perf_counter() - call.record.started)
        agent = self.config.agent(f.agent)
        grant, first = self._try(f, f.priority, arrived, now)
        if grant is not None and not self.queue.ahead(f, now):
            return grant.decision, grant.eligible
        if self._never_fits(f):  # the worker will refuse it (400): neither a 429 nor a place in the queue helps
            return first, self.state.snapshot().servable(f)
        mode = agent.on_overload if agent is not None else "queue"
        if mode == "degrade" and agent is not None:
            return self._degrade(call, agent, arrived, now)
        if mode == "reject":
            raise self._reject(call, "overloaded", first)
        return await self._wait(call, arrived, first)

    def wake(self) -> None:
        """Capacity may have freed (a reservation was released): grant what now fits."""
        if len(self.queue):
            self._dispatch()

    # -- servable now? --

    def _try(self, f: RequestFeatures, priority: float, arrived: float, now: float) -> tuple[Grant | None, Decision]:
        """A grant when ``f`` is servable now, and the policy's first decision (its predictions)."""
        eligible = self.state.snapshot().servable(f)
        first = self.policy(f, eligible)
        own = reserved_tokens(f, first.predicted.get("output_tokens"))
        share = self._share(priority)
        room = tuple(v for v in eligible.backends if self._room(v, own, share))
        if not room:
            return None, first
        names = {v.name for v in room}
        room_snap = eligible.among(room)
        decision = first if first.ranked and first.ranked[0] in names else self.policy(f, room_snap)
        if not decision.ranked or decision.ranked[0] not in names or self._late(f, decision, room_snap, arrived, now):
            return None, first
        return Grant(decision, room_snap, reserved_tokens(f, decision.predicted.get("output_tokens"))), first

    def has_room(self, v: BackendView, tokens: int, priority: float) -> bool:
        """Whether worker ``v`` has room for ``tokens`` more at ``priority``: what a request that takes no routing
        decision (an embedding) is admitted by."""
        return self._room(v, tokens, self._share(priority))

    def _never_fits(self, f: RequestFeatures) -> bool:
        """Whether no worker serving the request's models has the context for its prompt (estimated) and its
        ``max_tokens``: vLLM answers such a request 400 at once, so it goes to a worker now rather than waiting
        for room (at the head of the queue it would hold up every request behind it)."""
        need = f.prompt_tokens + (f.max_tokens or 0)
        return not any(need <= b.max_model_len for b in self.state.snapshot().backends if b.model in f.models)

    def _share(self, priority: float) -> float:
        """The share of a worker's ratio (``kv_full_ratio``, or its adaptive one) this priority may fill."""
        return max(MIN_LIMIT_SHARE, 1.0 - self.options.priority_headroom * max(0.0, priority))

    def _room(self, v: BackendView, own: int, share: float) -> bool:
        held_r, held_t = self._held.get(v.name, (0, 0))
        if self.options.max_waiting is not None and (v.waiting or 0) > self.options.max_waiting:
            return False
        if v.inflight_requests + held_r == 0:
            return True  # an idle worker takes any request: waiting would not make it fit better
        load = v.inflight_tokens + held_t + own
        ratio = self.options.kv_full_ratio
        if self.adaptive is not None:  # its own ratio, moved by feedback; it binds where this priority's share does
            ratio = self.adaptive.ratio(v, self.clock(), math.ceil(load / share))
        return load <= share * ratio * v.kv_budget_tokens

    def _late(self, f: RequestFeatures, d: Decision, room: FleetSnapshot, arrived: float, now: float) -> bool:
        """Predicted to miss its SLA on a loaded worker (on an idle one, waiting cannot help)."""
        view = room.by_name(d.ranked[0])
        if not self.options.predicted_deadline or not d.predicted or view is None or view.inflight_requests == 0:
            return False
        waited_ms = (now - arrived) * 1000.0
        for slo, key in ((f.ttft_slo_ms, "ttft_ms"), (f.e2e_slo_ms, "e2e_ms")):
            if slo is not None and key in d.predicted and d.predicted[key] + waited_ms > slo:
                return True
        return False

    # -- queue --

    async def _wait(self, call: ProxyCall, arrived: float, first: Decision) -> tuple[Decision, FleetSnapshot]:
        f, o = call.features, self.options
        if len(self.queue) >= o.max_queue:
            # full: a more urgent newcomer takes the place of the least urgent entry (that one gets the 429)
            last = self.queue.last()
            if last is None or last.future.done() or last.key <= self.queue.key(f.priority, self.clock()):
                raise self._reject(call, "queue_full", first)
            self.queue.remove(last)
            last.future.set_exception(_Displaced())
        ttft_ms, e2e_ms = self._service_ms(f, first)
        budget_s = o.max_queue_wait_s
        if f.ttft_slo_ms is not None:
            budget_s = min(budget_s, (f.ttft_slo_ms - ttft_ms) / 1000.0)
        if f.e2e_slo_ms is not None:
            budget_s = min(budget_s, (f.e2e_slo_ms - e2e_ms) / 1000.0)
        w = self.queue.push(f, arrived, self.clock(), arrived + max(0.0, budget_s))
        depth = self.metrics.queue_depth.labels(f.agent)
        depth.inc()
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.create_task(self._tick(), name="admission-tick")
        try:
            async with asyncio.timeout(max(0.0, w.deadline - self.clock())):
                grant = await w.future
        except TimeoutError:
            raise self._reject(call, "queue_timeout", first) from None
        except _Displaced:
            raise self._reject(call, "queue_full", first) from None
        finally:
            self.queue.remove(w)
            self._unhold(w)  # the proxy reserves in the same step as this returns
            depth.dec()
            call.record.queue_wait_s = waited = self.clock() - w.enqueued_at
            self.metrics.queue_wait.labels(f.agent).observe(waited)
        return grant.decision, grant.eligible

    async def _tick(self) -> None:
        while len(self.queue):
            await asyncio.sleep(self.options.tick_s)
            self._dispatch()

    def _dispatch(self) -> None:
        """Grant queued requests in order while they fit; a request that does not fit blocks the
        less urgent ones for its models (so small requests cannot starve a large one)."""
        now, blocked = self.clock(), set[str]()
        for w in self.queue:
            models = set(w.features.models)
            if w.future.done() or blocked & models:
                blocked |= models
                continue
            try:
                grant, _ = self._try(w.features, self.queue.effective_priority(w, now), w.arrived, now)
            except NoHealthyWorker as exc:
                self.queue.remove(w)
                w.future.set_exception(exc)
                continue
            if grant is None:
                blocked |= models
                continue
            self.queue.remove(w)
            w.hold = (grant.decision.ranked[0], grant.tokens)
            self._add_held(w.hold[0], 1, grant.tokens)
            w.future.set_result(grant)

    def _add_held(self, worker: str, requests: int, tokens: int) -> None:
        r, t = self._held.get(worker, (0, 0))
        if r + requests <= 0:
            self._held.pop(worker, None)
        else:
            self._held[worker] = (r + requests, t + tokens)

    def _unhold(self, w: Waiter) -> None:
        if w.hold is not None:
            self._add_held(w.hold[0], -1, -w.hold[1])
            w.hold = None

    # -- degrade and reject --

    def _degrade(self, call: ProxyCall, agent: AgentConfig, arrived: float,
                 now: float) -> tuple[Decision, FleetSnapshot]:  # fmt: skip
        f, cap = call.features, self.options.degrade_max_tokens
        named = f.models[0] if len(f.models) == 1 and f.models[0] in agent.models else None
        smaller = agent.models[agent.models.index(named) + 1 :] if named is not None else ()
        capped = replace(f, max_tokens=cap) if f.max_tokens is None or f.max_tokens > cap else None
        variants: list[tuple[RequestFeatures, tuple[str, ...]]] = []
        if smaller:
            variants.append((replace(f, models=smaller), ("model",)))
        if capped is not None:
            variants.append((capped, ("max_tokens",)))
            if smaller:
                variants.append((replace(capped, models=smaller), ("model", "max_tokens")))
        for g, kinds in variants:
            grant, _ = self._try(g, g.priority, arrived, now)
            if grant is None or self.queue.ahead(g, now):  # degraded, it still does not overtake the more urgent
                continue
            labels = []
            if "model" in kinds:
                backend = self.config.backend(grant.decision.ranked[0])
                labels.append(f"model={backend.model if backend is not None else g.models[0]}")
            if "max_tokens" in kinds:
                payload = {**call.payload, "max_tokens": cap}
                if "max_completion_tokens" in payload:
                    payload["max_completion_tokens"] = cap
                if isinstance(payload.get("min_tokens"), int) and payload["min_tokens"] > cap:
                    payload["min_tokens"] = cap  # else the worker refuses min_tokens > max_tokens (400)
                call.set_payload(payload)
                labels.append(f"max_tokens={cap}")
                call.record.max_tokens = cap
            call.features = g
            call.degraded = call.record.degraded = ", ".join(labels)
            for kind in kinds:
                self.metrics.degradations.labels(f.agent, kind).inc()
            return grant.decision, grant.eligible
        raise self._reject(call, "overloaded", self.policy(f, self.state.snapshot().servable(f)))

    def _reject(self, call: ProxyCall, reason: str, first: Decision) -> Overloaded:
        f = call.features
        self.metrics.rejections.labels(f.agent, reason).inc()
        call.record.error = "Overloaded"
        retry = self._drain_s(f, first)
        why = {"overloaded": "the fleet is saturated", "queue_full": "the admission queue is full",
               "queue_timeout": "no capacity freed before the request's SLA deadline"}[reason]  # fmt: skip
        return Overloaded(f"{why} (agent {f.agent!r}, priority {f.priority}); retry after {retry:.0f} s",
                          retry_after_s=retry, code=reason)  # fmt: skip

    def _drain_s(self, f: RequestFeatures, first: Decision) -> float:
        """Predicted seconds until a worker has room for ``f``: (the share of its reservations that must
        finish + one more per worker's worth of the queued requests that go first) x how long a request
        holds one, in [1, 60]."""
        try:
            eligible = self.state.snapshot().servable(f)
        except NoHealthyWorker:
            return 1.0
        own, best = reserved_tokens(f, first.predicted.get("output_tokens")), math.inf
        share = self._share(f.priority)
        # the queued requests that go first (more urgent now, for one of its models) need their room too: their
        # tokens come on top of this one's, spread over the workers that could take them
        ahead = self.queue.tokens_ahead(f, self.clock()) / max(1, len(eligible.backends))
        for v in eligible.backends:
            load = v.inflight_tokens + self._held.get(v.name, (0, 0))[1]
            ratio = self.options.kv_full_ratio if self.adaptive is None else self.adaptive.current(v.name)  # as _room
            room = max(1.0, share * ratio * v.kv_budget_tokens)
            excess = load + own - room
            # the share of a holding period to wait: what must free of the load now (an idle worker takes any
            # request, so at most all of it), then one more period per worker's worth of the queue ahead
            periods = (0.0 if excess <= 0 else min(1.0, excess / max(1, load))) + ahead / room
            if self.options.max_waiting is not None and (v.waiting or 0) > self.options.max_waiting:
                periods = max(periods, 1.0 / max(1, v.running or 1))
            best = min(best, periods * self._occupancy_s(v, f, first))
        return min(MAX_RETRY_AFTER_S, max(1.0, best if math.isfinite(best) else 1.0))

    def _occupancy_s(self, v: BackendView, f: RequestFeatures, first: Decision) -> float:
        if "e2e_ms" in first.predicted:
            return first.predicted["e2e_ms"] / 1000.0
        if v.ttft_ewma_s is not None and v.tpot_ewma_s is not None:
            return v.ttft_ewma_s + v.tpot_ewma_s * min(f.max_tokens or TYPICAL_OUTPUT_TOKENS, TYPICAL_OUTPUT_TOKENS)
        return DEFAULT_OCCUPANCY_S

    def _service_ms(self, f: RequestFeatures, first: Decision) -> tuple[float, float]:
        """Predicted TTFT and e2e once dispatched (the policy's, else the workers' EWMAs, else 0)."""
        p = first.predicted
        if "ttft_ms" in p and "e2e_ms" in p:
            return p["ttft_ms"], p["e2e_ms"]
        views = [v for v in self.state.snapshot().backends if v.model in f.models and v.ttft_ewma_s is not None]
        if not views:
            return 0.0, 0.0
        v = min(views, key=lambda x: x.ttft_ewma_s or 0.0)
        ttft = (v.ttft_ewma_s or 0.0) * 1000.0
        out = min(f.max_tokens or TYPICAL_OUTPUT_TOKENS, TYPICAL_OUTPUT_TOKENS)
        return ttft, ttft + (v.tpot_ewma_s or 0.0) * 1000.0 * out
