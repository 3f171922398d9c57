"""Engines that share one GPU: one clock, the GPU's time divided among the steps in flight.

Several vLLM processes on one GPU (no MPS) cannot run their kernels at the same time: the driver
time-slices the GPU between their contexts. Each engine still schedules its own steps, but a step
that needs ``d`` seconds of the GPU alone progresses at ``1/k`` of that speed while ``k`` engines
have a step in flight (processor sharing, the limit of time slices short against a step). Two
engines decoding all the time therefore each see a step of ``2 d``; an idle neighbour costs nothing.
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


class SharedGPU:
    """One GPU time line for several engines (all in one event loop)."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("a shared GPU needs at least one engine")
        self.engines = list(engines)
        self._wake = asyncio.Event()
        for e in self.engines:
            e._wake = self._wake  # any arrival wakes the GPU's loop

    def _start(self, inflight: dict[Engine, tuple[Batch, float]], t: float) -> None:
        """Schedule a step at ``t`` on every engine that has work and no step in flight."""
        for e in self.engines:
            if e not in inflight and not e.idle:
                batch = e.schedule(t)
                if batch.requests:
                    inflight[e] = (batch, batch.duration)  # GPU-alone seconds still to do

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        wake = self._wake
        inflight: dict[Engine, tuple[Batch, float]] = {}
        t = loop.time()  # the schedule: every step in flight has progressed up to t
        while True:
            self._start(inflight, t)
            if not inflight:
                wake.clear()
                await wake.wait()
                t = loop.time()
                continue
            k = len(inflight)
            first = min(left for _, left in inflight.values())
            end = t + first * k  # when the next step in flight completes, if nothing joins
            # Sleep until then; an arrival on an engine without a step in flight joins the sharing
            # at the moment it is seen (and slows the others down from then on).
            joined = False
            while True:
                wake.clear()
                delay = end - loop.time()
                if delay <= 0:
                    break
                if len(inflight) == len(self.engines):
                    await asyncio.sleep(delay)
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), delay)
                now = loop.time()
                if now < end and any(e not in inflight and not e.idle for e in self.engines):
                    done = (now - t) / k
                    for e, (batch, left) in inflight.items():
                        inflight[e] = (batch, left - done)
                    t = now
                    joined = True
                    break
            if joined:
                continue
            lag = loop.time() - end
            done = first
            finished = [e for e, (_, left) in inflight.items() if left - done <= 1e-12]
            for e, (batch, left) in list(inflight.items()):
                inflight[e] = (batch, left - done)
            for e in finished:
                batch, _ = inflight.pop(e)
                st = e.stats
                st.last_lag = lag
                st.lag.observe(lag)
                e.commit(batch, end)
            t = end
