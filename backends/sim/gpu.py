"""Engines that share one GPU: one clock, the GPU's time divided among the steps in flight.

Several vLLM processes on one GPU (no MPS) cannot run their kernels at the same time: the driver
time-slices the GPU between their contexts. Each engine still schedules its own steps, but the GPU
work of a step (``Batch.gpu``, ``d`` seconds alone) progresses at ``1/k`` of its speed while ``k``
engines have GPU work in flight (processor sharing, the limit of time slices short against a
step). Two engines decoding all the time therefore each see a step of ``2 d``; an idle neighbour
costs nothing. A step that runs without CUDA graphs (the profile's ``cudagraph`` cliff) is mostly
kernel launches from the CPU: only its linear-model part is GPU work, done after the launch-bound
rest (``duration - gpu``), which neither waits for nor slows down the others.

Measured on an H200 (docs/REAL_VLLM.md) with three busy workers: the 7B slowed down 3.3x and the
small ones ~2.2x, each in proportion to its own step, as processor sharing has it (whole steps
taken in turn would give every busy worker the same inter-token time, the sum of the steps).

:class:`SharedGPU` runs the steps of its engines in place of each :meth:`Engine.run`; an engine
alone keeps its own loop (no cost added to the one-worker-per-GPU path).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from backends.sim.engine import Batch, Engine

_EPS = 1e-9


class _Step:
    __slots__ = ("batch", "cpu", "gpu")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.gpu = min(batch.gpu, batch.duration) if batch.gpu > 0 else batch.duration  # GPU seconds to do
        self.cpu = batch.duration - self.gpu  # launch-bound seconds to do first (not shared)


class SharedGPU:
    """One GPU time line for several engines (all in one event loop)."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("a shared GPU needs at least one engine")
        self.engines = list(engines)
        self._wake = asyncio.Event()
        for e in self.engines:
            e._wake = self._wake  # any arrival wakes the GPU's loop

    def _start(self, steps: dict[Engine, _Step], t: float) -> None:
        """Schedule a step at ``t`` on every engine that has work and no step in flight."""
        for e in self.engines:
            if e not in steps and not e.idle:
                batch = e.schedule(t)
                if batch.requests:
                    steps[e] = _Step(batch)

    @staticmethod
    def _advance(steps: dict[Engine, _Step], dt: float, k: int) -> None:
        """``dt`` seconds pass with ``k`` steps sharing the GPU."""
        for s in steps.values():
            if s.cpu > _EPS:
                s.cpu -= dt
            else:
                s.gpu -= dt / k

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        wake = self._wake
        steps: dict[Engine, _Step] = {}
        t = loop.time()  # the schedule: every step in flight has progressed up to t
        while True:
            self._start(steps, t)
            if not steps:
                wake.clear()
                await wake.wait()
                t = loop.time()
                continue
            k = sum(1 for s in steps.values() if s.cpu <= _EPS) or 1
            dt = min(s.cpu if s.cpu > _EPS else s.gpu * k for s in steps.values())
            end = t + max(dt, 0.0)  # the next phase change, if nothing joins before
            # Sleep until then; an arrival on an engine without a step in flight joins at the moment
            # it is seen (and slows the others down from then on).
            joined = False
            while True:
                wake.clear()
                delay = end - loop.time()
                if delay <= 0:
                    break
                if len(steps) == len(self.engines):
                    await asyncio.sleep(delay)
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), delay)
                now = loop.time()
                if now < end and any(e not in steps and not e.idle for e in self.engines):
                    self._advance(steps, now - t, k)
                    t = now
                    joined = True
                    break
            if joined:
                continue
            self._advance(steps, end - t, k)
            t = end
            done = [e for e, s in steps.items() if s.cpu <= _EPS and s.gpu <= _EPS]
            if done:
                lag = loop.time() - end
                for e in done:
                    batch = steps.pop(e).batch
                    st = e.stats
                    st.last_lag = lag
                    st.lag.observe(lag)
                    e.commit(batch, end)
