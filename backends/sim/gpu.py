"""Engines that share one GPU: one clock, the GPU handed round in time slices.

Several vLLM processes on one GPU (no MPS) cannot run their kernels at the same time: the driver
time-slices the GPU between their contexts. Each engine still schedules its own steps; a step is
**CPU work** first (scheduler, sampler, graph launch; the profile's ``1 - gpu_share`` of the step, and
the launch-bound rest of an eager step), its own and never shared, then **GPU work**
(``Batch.gpu``). Contexts with GPU work take **turns in round-robin order**: a turn lasts
``min(remaining GPU work, timeslice)``; a context whose turn ends with work left goes to the back of
the queue, and handing the GPU to another context first costs ``switch`` seconds. A context alone
keeps the GPU (no switch, no cut), so an idle neighbour costs nothing.

The consequences measured on an H200 (``docs/results/real-h200/probes/colocate-*.json``, docs/profiling.md): small
workers whose GPU work fits in one slice lock-step (equal inter-token times, about the sum of their
GPU parts plus the others' turns), and a step longer than a slice (the 7B's ~4.5 ms) needs several
turns and waits for every neighbour's turn between them (three busy workers at batch 8: the 7B 3.2x its own
step, the small ones 1.9-2.6x). Processor sharing (each step stretched in proportion to its own length,
this module's first model) cannot give both.

:class:`SharedGPU` runs the steps of its engines in place of each :meth:`Engine.run`; an engine
alone keeps its own loop (no cost added to the one-worker-per-GPU path).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Sequence

from backends.sim.engine import Batch, Engine
from router.core.profile import GPU_SWITCH_S, GPU_TIMESLICE_S

_EPS = 1e-12


class _Step:
    __slots__ = ("batch", "cpu_end", "gpu")

    def __init__(self, batch: Batch, t: float) -> None:
        self.batch = batch
        self.gpu = min(batch.gpu, batch.duration)  # GPU seconds left to do
        self.cpu_end = t + batch.duration - self.gpu  # when its CPU part ends (then it queues for the GPU)


class SharedGPU:
    """One GPU time line for several engines (all in one event loop)."""

    def __init__(self, engines: Sequence[Engine], timeslice: float = GPU_TIMESLICE_S,
                 switch: float = GPU_SWITCH_S) -> None:
        if not engines:
            raise ValueError("a shared GPU needs at least one engine")
        if timeslice <= 0 or switch < 0:
            raise ValueError(f"timeslice must be > 0 and switch >= 0, got {timeslice}, {switch}")
        self.engines = list(engines)
        speedup = self.engines[0].speedup
        self.timeslice = timeslice / speedup
        self.switch = switch / speedup
        self._wake = asyncio.Event()
        for e in self.engines:
            e._wake = self._wake  # any arrival wakes the GPU's loop
        self._steps: dict[Engine, _Step] = {}
        self._cpu: list[Engine] = []  # engines whose step is in its CPU part
        self._queue: deque[Engine] = deque()  # engines waiting for a GPU turn, in turn order
        self._cur: Engine | None = None  # the engine whose turn it is
        self._last: Engine | None = None  # whose context the GPU last ran
        self._turn_start = 0.0  # when the current turn's GPU work began
        self._turn_end = 0.0

    # -- the model, in schedule time (no I/O; tests drive it directly) --------------------------
    def start(self, t: float) -> None:
        """Schedule a step at ``t`` on every engine that has work and no step in flight."""
        steps = self._steps
        for e in self.engines:
            if e not in steps and not e.idle:
                batch = e.schedule(t)
                if batch.requests:
                    step = steps[e] = _Step(batch, t)
                    if step.cpu_end <= t:
                        self._enqueue(e, t)
                    else:
                        self._cpu.append(e)
        if self._cur is None:
            self._next_turn(t)

    def _enqueue(self, e: Engine, t: float) -> None:
        """``e`` has GPU work from ``t``: it waits for a turn. A turn longer than a slice (the GPU was
        the current context's alone) now ends at the next slice boundary."""
        self._queue.append(e)
        cur = self._cur
        if cur is not None and self._turn_end - self._turn_start > self.timeslice:
            slices = max(1, math.ceil((t - self._turn_start) / self.timeslice - 1e-9))
            q = self._turn_start + slices * self.timeslice
            if q < self._turn_end:
                self._steps[cur].gpu += self._turn_end - q  # not done after all
                self._turn_end = q

    def _next_turn(self, t: float) -> None:
        if not self._queue:
            return
        e = self._cur = self._queue.popleft()
        step = self._steps[e]
        begin = t + (self.switch if self._last is not None and self._last is not e else 0.0)
        # alone, the whole remainder in one turn (cut at a slice boundary if someone queues)
        run = step.gpu if not self._queue else min(step.gpu, self.timeslice)
        step.gpu -= run
        self._turn_start, self._turn_end = begin, begin + run
        self._last = e

    def next_event(self) -> float:
        """When the model next changes by itself (a CPU part or a turn ends); inf when nothing runs."""
        t = min((self._steps[e].cpu_end for e in self._cpu), default=float("inf"))
        return min(t, self._turn_end) if self._cur is not None else t

    def advance(self, t: float) -> list[Engine]:
        """Process every event up to ``t``; returns the engines whose step ended (to commit at ``t``)."""
        done: list[Engine] = []
        while True:
            cpu = min(self._cpu, key=lambda e: self._steps[e].cpu_end, default=None)
            cpu_t = self._steps[cpu].cpu_end if cpu is not None else float("inf")
            turn_t = self._turn_end if self._cur is not None else float("inf")
            if min(cpu_t, turn_t) > t + _EPS:
                return done
            if cpu is not None and cpu_t < turn_t:
                self._cpu.remove(cpu)
                if self._steps[cpu].gpu <= _EPS:
                    done.append(cpu)  # no GPU work at all
                    continue
                self._enqueue(cpu, cpu_t)
                if self._cur is None:
                    self._next_turn(cpu_t)
                continue
            e = self._cur
            assert e is not None
            self._cur = None
            if self._steps[e].gpu <= _EPS:
                done.append(e)
            else:
                self._queue.append(e)
            self._next_turn(turn_t)

    def pop(self, e: Engine) -> Batch:
        return self._steps.pop(e).batch

    # -- the clock --------------------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        wake = self._wake
        t = loop.time()  # the schedule: every event up to t has been processed
        while True:
            self.start(t)
            if not self._steps:
                wake.clear()
                await wake.wait()
                t = loop.time()
                continue
            end = self.next_event()
            # Sleep until then; an arrival on an engine without a step in flight starts a step at the
            # moment it is seen (its CPU part first, then it queues for the GPU).
            joined = False
            while True:
                wake.clear()
                delay = end - loop.time()
                if delay <= 0:
                    break
                if len(self._steps) == len(self.engines):
                    await asyncio.sleep(delay)
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), delay)
                now = loop.time()
                if now < end and any(e not in self._steps and not e.idle for e in self.engines):
                    t = now
                    joined = True
                    break
            if joined:
                self._commit(self.advance(t), t, loop.time())
                continue
            t = end
            self._commit(self.advance(t), t, loop.time())

    def _commit(self, done: list[Engine], t: float, now: float) -> None:
        if not done:
            return
        lag = now - t
        for e in done:
            st = e.stats
            st.last_lag = lag
            st.lag.observe(lag)
            e.commit(self.pop(e), t)
