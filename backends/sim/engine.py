"""A vLLM V1-style engine: continuous batching, chunked prefill, paged KV, preemption.

The scheduler follows ``vllm/v1/core/sched/scheduler.py``: each step first advances the running
requests in order (a decoding request takes one token of the step's budget, a request part-way
through its prefill takes its next chunk) and, when one cannot get KV blocks, preempts the newest
running request (recompute: its blocks are freed and it goes back to the front of the queue).
Then, if nobody was preempted, waiting requests are admitted first-come first-served while the
token budget and ``max_num_seqs`` allow, each reusing its longest cached prefix. Under vLLM's
``--scheduling-policy priority`` (:mod:`backends.sim.waiting`) the queue is ordered by each request's
``priority`` (lower first), then arrival, and the running request preempted is the one last in that
order. A step lasts what the profile's linear model says for its features (plus the eager-mode cost
when it schedules more tokens than vLLM captures CUDA graphs for), divided by ``speedup``; its tokens
are released when it ends. In front of the queue sits the API server, a FIFO server that handles one request at
a time. Time is an absolute schedule, so a late wake-up is caught up, and measured as lag.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from dataclasses import dataclass, field

from backends.sim.hist import ITL_BUCKETS, LAG_BUCKETS, REQUEST_BUCKETS, TTFT_BUCKETS, Hist
from backends.sim.kvcache import KVCache
from backends.sim.request import Request, Status
from backends.sim.textgen import word_index
from backends.sim.waiting import PriorityQueue, make_queue
from router.core.errors import ProfileError
from router.core.profile import Profile, eager_step, stream_delay

__all__ = ["Batch", "Engine", "EngineStats", "Request", "Status"]


@dataclass
class EngineStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    finished: int = 0
    steps: int = 0
    busy_s: float = 0.0
    last_lag: float = 0.0
    ttft: Hist = field(default_factory=lambda: Hist(TTFT_BUCKETS))
    e2e: Hist = field(default_factory=lambda: Hist(REQUEST_BUCKETS))
    itl: Hist = field(default_factory=lambda: Hist(ITL_BUCKETS))
    queue: Hist = field(default_factory=lambda: Hist(REQUEST_BUCKETS))
    prefill: Hist = field(default_factory=lambda: Hist(REQUEST_BUCKETS))  # first scheduled -> first token
    lag: Hist = field(default_factory=lambda: Hist(LAG_BUCKETS))


@dataclass
class Batch:
    """One scheduled step: who computes how many tokens, and for how long."""

    start: float
    requests: list[Request] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)
    duration: float = 0.0
    gpu: float = 0.0  # of which the GPU is busy (the rest: CPU work and eager launches); for SharedGPU


class Engine:
    def __init__(
        self,
        profile: Profile,
        kv_tokens: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        speedup: float = 1.0,
        seed: int = 0,
        scheduling_policy: str = "fcfs",
    ) -> None:
        self.profile = profile
        self.kv = KVCache(kv_tokens // profile.block_size, profile.block_size)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.speedup = speedup
        self.waiting: deque[Request] | PriorityQueue[Request] = make_queue(scheduling_policy)  # ProfileError: unknown
        self._by_priority = isinstance(self.waiting, PriorityQueue)
        self.running: list[Request] = []
        self.stats = EngineStats()
        self._wake = asyncio.Event()
        # overhead_s.sim_http, the sim's own HTTP cost that the fit took off the measured constant, is wall time, so a
        # speedup x does not scale it: add back the (1/x - 1) of it that a run at x < 1 would otherwise miss
        self._ttft_overhead = max(0.0, profile.ttft_overhead_s / speedup + profile.sim_http_s * (1.0 / speedup - 1.0))
        # the constant's request-to-request spread (profile.ttft_jitter_s), drawn in submission order
        self._jitter = profile.ttft_jitter_s / speedup
        self._jitter_rng = random.Random(f"ttft-jitter:{seed}")
        if self._jitter / 2 > self._ttft_overhead + 1e-12:  # sim_http does not scale: a speedup > 1 can get here
            raise ProfileError(
                f"profile {profile.name}: overhead_s.ttft_jitter ({profile.ttft_jitter_s}) is wider than twice "
                f"the TTFT constant at speedup {speedup} ({2 * self._ttft_overhead * speedup:.6f}); "
                "lower the speedup or the jitter",
                setting="speedup",
            )
        self._gpu_share = profile.gpu_share
        cg = profile.cudagraph
        # steps scheduling more than this many tokens run without CUDA graphs (0: no limit)
        self._graph_max = cg.max_tokens if cg is not None else 0
        self._eager_floor = cg.eager_floor_s if cg is not None else 0.0
        self._eager_extra = cg.eager_extra_s if cg is not None else 0.0
        self._prefill_extra = cg.extra(decoding=False) if cg is not None else 0.0  # a step without decodes
        self._eager_per_token = cg.eager_per_token_s if cg is not None else 0.0
        fe = profile.frontend
        self._fe_request = fe.per_request / speedup if fe is not None else 0.0
        self._fe_token = fe.per_prompt_token / speedup if fe is not None else 0.0
        self._fe_free = float("-inf")  # when the serial front end is next free (loop clock)
        # the API server's streaming work (Frontend.stream_token / stream_wait): its share of the event loop
        self._fe_stream_token = fe.stream_token if fe is not None else 0.0
        self._fe_stream_wait = fe.stream_wait / speedup if fe is not None and fe.stream_token > 0 else 0.0
        self._stream_rate = 0.0
        self._async = profile.async_scheduling
        self._sampling = profile.sampling
        # the previous step's (start, end): under async scheduling a step that follows it back to back
        # was scheduled when it started, so it admits only requests queued by then
        self._prev = (float("-inf"), float("-inf"))

    @property
    def capacity_tokens(self) -> int:
        return self.kv.num_blocks * self.kv.block_size

    # -- requests in and out --------------------------------------------------------------------
    def frontend_exit(self, now: float, prompt_len: int) -> float:
        """When a request handed to the front end at ``now`` reaches the engine's queue.

        The serial part (``frontend_s``) is a FIFO server: the request waits until the front end is
        free, then occupies it for ``per_request + per_prompt_token * prompt_len``; the constant
        ``overhead_s.ttft`` follows in parallel (it does not hold the server). While requests run, the
        server's streaming work delays it by ``stream_wait * rho / (1 - rho)`` (``Frontend``).
        """
        t = now
        if self._fe_request > 0 or self._fe_token > 0:
            free = self._fe_free
            t = (free if free > now else now) + self._fe_request + self._fe_token * prompt_len
            self._fe_free = t
        if self._fe_stream_wait and self.running:
            t += stream_delay(self._fe_stream_wait, self._stream_rate * self._fe_stream_token)
        if self._jitter > 0:
            return t + self._ttft_overhead + (self._jitter_rng.random() - 0.5) * self._jitter  # >= 0: see __init__
        return t + self._ttft_overhead

    def submit(self, req: Request) -> None:
        """Hand a request over; it reaches the queue after the front end (see :meth:`frontend_exit`)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        at = self.frontend_exit(now, req.prompt_len)
        if at > now:
            loop.call_at(at, self.enqueue, req, at)
        else:
            self.enqueue(req, now)

    def enqueue(self, req: Request, now: float | None = None) -> None:
        """The request reaches the engine's queue (at ``now``; default: its arrival)."""
        if req.status is not Status.PENDING:
            return  # aborted while in the front end
        req.queued_at = req.arrival if now is None else now
        req.status = Status.WAITING
        self.waiting.append(req)
        self._wake.set()

    def abort(self, req: Request) -> None:
        """Drop a request (client gone); its blocks return to the pool, cached."""
        if req.status is Status.WAITING:
            self.waiting.remove(req)
        elif req.status is Status.RUNNING:
            self.running.remove(req)
            self.kv.free(req)
        elif req.done:
            return
        req.status = Status.ABORTED
        req.wake()

    # -- the scheduler --------------------------------------------------------------------------
    def schedule(self, now: float) -> Batch:
        kv, bs, st = self.kv, self.kv.block_size, self.stats
        batch = Batch(start=now)
        reqs, news = batch.requests, batch.num_new
        budget = self.max_num_batched_tokens
        running = self.running
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            start = req.num_computed
            n = min(req.num_tokens - start, budget)
            if start + n > len(req.block_ids) * bs:
                while not kv.allocate(req, start + n):
                    victim = running.pop() if not self._by_priority else self._lowest(running)
                    self._preempt(victim)
                    preempted = True
                    if victim is req:
                        break
                    if victim in reqs:  # scheduled earlier in this step (priority policy): take it back
                        k = reqs.index(victim)
                        del reqs[k]
                        budget += news.pop(k)
                        i -= 1
                if req.status is not Status.RUNNING:
                    break
            reqs.append(req)
            news.append(n)
            budget -= n
            i += 1
        n_decode, ctx, prefill, attn = _step_features(reqs, news)
        if not preempted:
            waiting = self.waiting
            seen_by = self._admit_by(now, bool(reqs))
            # when vLLM scheduled this step: under async scheduling, as the previous one started (its queue and
            # prefill time histograms split there)
            scheduled_at = seen_by if seen_by < now else now
            while waiting and budget > 0 and len(running) < self.max_num_seqs:
                req = waiting[0]
                head = req.queued_at <= seen_by
                if not head:  # arrived while the previous step ran: vLLM had already scheduled this one
                    if not self._by_priority:
                        break  # and so did everyone behind it
                    seen = next((r for r in waiting if r.queued_at <= seen_by), None)
                    if seen is None:
                        break
                    req = seen
                total = req.num_tokens
                prefix = kv.find_prefix(req, total)
                start = len(prefix) * bs
                n = min(total - start, budget)
                if not kv.allocate(req, start + n, prefix):
                    break
                if head:
                    waiting.popleft()
                else:
                    waiting.remove(req)
                st.prefix_queries += total
                st.prefix_hits += start
                req.num_computed = start
                req.status = Status.RUNNING
                if req.first_scheduled < 0:
                    # a schedule behind the loop's clock can predate the queueing (a late wake-up): no negative wait
                    at = scheduled_at if scheduled_at > req.queued_at else req.queued_at
                    req.first_scheduled = at
                    req.cached_tokens = start
                    st.queue.observe(at - req.queued_at)
                running.append(req)
                reqs.append(req)
                news.append(n)
                budget -= n
                prefill += n
                attn += n * (start + n / 2)
        if reqs:
            c = self.profile.step_time
            seconds = (
                c.base
                + c.prefill_tokens * prefill
                + c.decode_seqs * n_decode
                + c.decode_context_tokens * ctx
                + c.prefill_attn_mtok2 * attn / 1e6
            )
            tokens = self.max_num_batched_tokens - budget
            batch.gpu = seconds * self._gpu_share / self.speedup
            eager = bool(self._graph_max) and tokens > self._graph_max
            if eager:
                extra = self._eager_extra if n_decode else self._prefill_extra
                seconds = eager_step(seconds, tokens, self._graph_max, self._eager_floor, extra,
                                     self._eager_per_token)  # fmt: skip
            if self._sampling is not None:
                seconds = self._with_sampling(seconds, reqs, eager)
            batch.duration = seconds / self.speedup
        return batch

    def _with_sampling(self, seconds: float, reqs: list[Request], eager: bool) -> float:
        """The step's length with the sampler's extra CPU work for its non-greedy requests (``Sampling``): vLLM
        launches the sampler's kernels after the model's, on the CPU, while the GPU runs, so the work costs time
        only beyond the step's own CPU time (a step inside the CUDA graphs: ``cpu_base + cpu_per_seq * n``; an
        eager step is launch-bound, and a profile without ``cpu_base`` CPU-bound: all of it)."""
        s = self._sampling
        assert s is not None
        cost = 0.0
        if s.random and any(r.random for r in reqs):
            cost += s.random
        if s.min_tokens and any(len(r.output) < r.min_tokens for r in reqs):
            cost += s.min_tokens
        if not cost:
            return seconds
        cpu = seconds if s.cpu_base is None or eager else s.cpu_base + s.cpu_per_seq * len(reqs)
        return cpu + cost if cpu + cost > seconds else seconds

    def _admit_by(self, now: float, busy: bool) -> float:
        """The latest queue time a request may have to join the step scheduled at ``now``.

        Synchronous scheduling: no limit. Async: a step that follows the previous one back to back was
        scheduled when that one started; a request that came later waits one more step. Only when the
        step has other work: a lone request on an engine going idle is scheduled at once (in vLLM the
        finished requests' look-ahead step would cost it that step too; not modelled).
        """
        start, end = self._prev
        if self._async and busy and end >= now - 1e-9:
            return start
        return float("inf")  # everyone queued (the schedule may run behind the loop's clock)

    @staticmethod
    def _lowest(running: list[Request]) -> Request:
        """The priority policy's victim: the running request last in (priority, arrival) order."""
        victim = max(running, key=lambda r: (r.priority, r.arrival))
        running.remove(victim)
        return victim

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.num_computed = 0
        req.status = Status.WAITING
        self.waiting.appendleft(req)
        self.stats.preemptions += 1

    def commit(self, batch: Batch, now: float) -> None:
        """The step ended at ``now``: its KV is written and each caught-up request samples a token."""
        kv, bs, st = self.kv, self.kv.block_size, self.stats
        running_status = Status.RUNNING
        finished = False
        sampled = streamed = 0
        ttft, itl = st.ttft, st.itl
        for req, n in zip(batch.requests, batch.num_new, strict=True):
            if req.status is not running_status:
                continue  # aborted during the step
            computed = req.num_computed + n
            req.num_computed = computed
            if computed // bs > req.num_cached_blocks:
                kv.commit_full_blocks(req, computed)
            out = req.output
            if computed < req.prompt_len + len(out):
                continue  # mid-prefill chunk: nothing sampled
            i = len(out)
            sampled += 1
            if req.notify_each:
                streamed += 1  # a token the API server writes as it comes
            out.append(req.marker_index if i == req.marker_at else word_index(req.word_start, i))
            if i == 0:
                req.first_token = now
                ttft.observe(now - req.arrival)
                st.prefill.observe(now - req.first_scheduled)
                st.prompt_tokens += req.prompt_len
            else:
                itl.observe(now - req.last_token)
            req.last_token = now
            if i + 1 == req.final_len:
                req.status = Status.FINISHED
                req.finished_at = now
                kv.free(req)
                st.e2e.observe(now - req.arrival)
                st.finished += 1
                finished = True
            elif not req.notify_each:
                continue
            w = req.waiter
            if w is not None:
                req.waiter = None
                if not w.done():
                    w.set_result(None)
        st.generation_tokens += sampled
        if self._fe_stream_wait and now > batch.start:  # streamed tokens per modelled second, smoothed over steps
            self._stream_rate += 0.3 * (streamed / ((now - batch.start) * self.speedup) - self._stream_rate)
        if finished:
            self.running = [r for r in self.running if r.status is running_status]
        st.steps += 1
        st.busy_s += batch.duration
        self._prev = (batch.start, now)

    # -- the clock ------------------------------------------------------------------------------
    def step(self, now: float) -> Batch:
        """Run one whole step at ``now`` synchronously (for tests and offline use)."""
        batch = self.schedule(now)
        self.commit(batch, now + batch.duration)
        return batch

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        st = self.stats
        t = loop.time()
        while True:
            if self.idle:
                self._wake.clear()
                await self._wake.wait()
                t = loop.time()
            batch = self.schedule(t)
            if not batch.requests:
                # Nothing can run (cannot happen with validated requests); wait for a change.
                self._wake.clear()
                await self._wake.wait()
                t = loop.time()
                continue
            end = t + batch.duration
            delay = end - loop.time()
            await asyncio.sleep(delay if delay > 0 else 0)
            lag = loop.time() - end
            st.last_lag = lag
            st.lag.observe(lag)
            self.commit(batch, end)
            t = end


def _step_features(reqs: list[Request], news: list[int]) -> tuple[int, int, int, float]:
    """(decoding sequences, their context tokens, prefill tokens, prefill attention) of the running requests a
    step scheduled: a request one token short of its computed length decodes, any other runs a prefill chunk."""
    n_decode = ctx = prefill = 0
    attn = 0.0
    for req, n in zip(reqs, news, strict=True):
        start = req.num_computed
        if n == 1 and req.output and start == req.num_tokens - 1:
            n_decode += 1
            ctx += start + 1
        else:
            prefill += n
            attn += n * (start + n / 2)
    return n_decode, ctx, prefill, attn
