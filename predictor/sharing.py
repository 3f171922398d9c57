"""Workers that time-share one GPU: what busy neighbours cost a worker's steps, and what waking an idle worker
costs its neighbours.

Several vLLM processes on one GPU (no MPS) take turns on it: a context runs at most a time slice
(:data:`~router.core.profile.GPU_TIMESLICE_S`) while another has work, and handing the GPU over costs
:data:`~router.core.profile.GPU_SWITCH_S`. A step of GPU work ``g`` (the profile's ``gpu_share`` of the step)
then needs ``ceil(g / slice)`` turns, and between two of them every busy neighbour runs one turn of its own:
the step lasts ``max(step, g + turns x wait)``, where ``wait`` is the neighbours' turns and the hand-overs
(``sum(min(g_j, slice) + switch) + switch``). On an H200 with three busy workers at batch 8 that gives the 7B
3.3x its own step and the small ones 2.3-2.6x (measured: 3.2x and 1.9-2.6x, docs/profiling.md).

A router that sees only each worker's own latency spreads work over co-located workers as if they were apart,
and every step on the small one slows the big one's whole batch. So the predictive policy stretches each
candidate's predicted TTFT and decode time by its busy neighbours (:func:`price`), and charges a candidate that
is idle beside busy neighbours for the time it takes from them: each of their requests waits
``(stretched step - step) / stretched step`` of the new request's e2e longer.

Timings a worker logs under sharing are the stretched ones; :func:`unshared` turns them back into the worker's
own (by the stretch its decision recorded), so the learned latency models and the online profiles learn the
worker alone and the stretch is applied once. (Plain Python over the few workers: this runs in decisions.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from predictor.boosting import Array
from predictor.model import Prediction
from predictor.prior import WorkerProfile, worker_load
from router.core.profile import GPU_SWITCH_S, GPU_TIMESLICE_S, eager_step
from router.core.types import BackendView

#: the keys of a decision's ``predicted`` that carry the stretch its TTFT and decode time were priced with
TTFT_STRETCH, DECODE_STRETCH = "gpu_ttft_stretch", "gpu_decode_stretch"


def decode_step(wp: WorkerProfile, view: BackendView) -> float:
    """The worker's decode step now (wall seconds, alone on its GPU), or 0 when it has nothing to run."""
    n = worker_load(view)
    if n <= 0:
        return 0.0
    n_run = min(n, wp.max_num_seqs)
    per_req = view.inflight_tokens / view.inflight_requests if view.inflight_requests else 0.0
    linear = wp.base + (wp.decode_seqs + wp.decode_ctx * 0.5 * per_req) * n_run
    return eager_step(linear, n_run, wp.graph_max, wp.eager_floor, wp.eager_extra, wp.eager_token)


def turn_wait(gpu_parts: Sequence[float], timeslice: float, switch: float) -> float:
    """What one of a worker's turns waits for, with busy neighbours doing ``gpu_parts`` of GPU work a step."""
    if not gpu_parts:
        return 0.0
    return sum(min(g, timeslice) + switch for g in gpu_parts) + switch


def stretched(t: float, gpu_share: float, wait: float, timeslice: float) -> float:
    """How long ``t`` seconds of a worker's work (``gpu_share`` of it on the GPU) take with ``wait`` a turn."""
    if wait <= 0.0 or t <= 0.0:
        return t
    g = gpu_share * t
    return max(t, g + math.ceil(g / timeslice - 1e-9) * wait)


@dataclass(frozen=True, slots=True)
class Sharing:
    """Per candidate: the factors its TTFT and decode time are stretched by, and the seconds of its neighbours'
    requests that sending it this request costs (the neighbours slowed while it runs)."""

    ttft: list[float]
    decode: list[float]
    neighbours_s: list[float]


def price(
    views: Sequence[BackendView],
    profiles: Sequence[WorkerProfile],
    ttft: Sequence[float],
    tpot: Sequence[float],
    e2e: Sequence[float],
    fleet: Sequence[BackendView],
    fleet_profiles: Mapping[str, WorkerProfile],
) -> Sharing | None:
    """The sharing of each candidate ``views[i]`` (predicted p50 ``ttft``, ``tpot``, ``e2e`` in seconds, alone)
    with the busy workers of ``fleet`` on its GPU; None when no candidate has a busy neighbour."""
    busy: dict[str, list[tuple[str, float, float, float, int]]] = {}  # gpu -> (name, step, gpu_share, scale, load)
    for u in fleet:
        if u.gpu is None:
            continue
        wp = fleet_profiles.get(u.name)
        step = decode_step(wp, u) if wp is not None else 0.0
        if step > 0.0 and wp is not None:
            busy.setdefault(u.gpu, []).append((u.name, step, wp.gpu_share, wp.time_scale, worker_load(u)))
    if not busy:
        return None
    n = len(views)
    ft, fd, cost = [1.0] * n, [1.0] * n, [0.0] * n
    for i, (v, wp) in enumerate(zip(views, profiles, strict=True)):
        on_gpu = busy.get(v.gpu) if v.gpu is not None else None
        if not on_gpu:
            continue
        sl, sw = GPU_TIMESLICE_S * wp.time_scale, GPU_SWITCH_S * wp.time_scale
        others = [b for b in on_gpu if b[0] != v.name]
        wait = turn_wait([gs * s for _, s, gs, _, _ in others], sl, sw)
        if wait > 0.0:
            if ttft[i] > 0.0:
                ft[i] = stretched(ttft[i], wp.gpu_share, wait, sl) / ttft[i]
            if tpot[i] > 0.0:
                fd[i] = stretched(tpot[i], wp.gpu_share, wait, sl) / tpot[i]
        if len(others) == len(on_gpu) and others:  # idle now: waking it slows every busy neighbour
            mine = wp.gpu_share * tpot[i]
            lost = 0.0
            for name, s, gs, scale, load in others:
                nsl, nsw = GPU_TIMESLICE_S * scale, GPU_SWITCH_S * scale
                theirs = [g2 * s2 for n2, s2, g2, _, _ in others if n2 != name]
                before = stretched(s, gs, turn_wait(theirs, nsl, nsw), nsl)
                after = stretched(s, gs, turn_wait([*theirs, mine], nsl, nsw), nsl)
                lost += load * (after - before) / after
            d = ft[i] * ttft[i] + fd[i] * max(e2e[i] - ttft[i], 0.0)
            cost[i] = lost * d
    if all(f == 1.0 for f in ft) and all(f == 1.0 for f in fd) and not any(cost):
        return None
    return Sharing(ft, fd, cost)


def stretch(a: Array, factors: Sequence[float]) -> Array:
    """``a`` (rows per candidate) times each candidate's factor."""
    out: Array = a * np.asarray(factors)[:, None]
    return out


def unshared(
    predicted: Mapping[str, float] | None, ttft_s: float | None, e2e_s: float | None, tpot_s: float | None = None
) -> tuple[float | None, float | None, float | None]:
    """A request's TTFT, e2e and TPOT as its worker would have taken them alone, by the stretch its decision
    priced."""
    if not predicted:
        return ttft_s, e2e_s, tpot_s
    ft, fd = predicted.get(TTFT_STRETCH, 1.0), predicted.get(DECODE_STRETCH, 1.0)
    tpot = None if tpot_s is None else tpot_s / fd
    if (ft == 1.0 and fd == 1.0) or e2e_s is None:
        return ttft_s, e2e_s, tpot
    if ttft_s is None:  # non-streamed: the whole answer is mostly decode
        return None, e2e_s / fd, tpot
    own_ttft = ttft_s / ft
    return own_ttft, own_ttft + max(e2e_s - ttft_s, 0.0) / fd, tpot


def shared(p: Prediction, sharing: Sharing) -> Prediction:
    """``p`` with each candidate's TTFT and decode time stretched by its neighbours (:func:`price`)."""
    ttft = stretch(p.ttft, sharing.ttft)
    decode = np.maximum(p.e2e - p.ttft, 0.0)
    return Prediction(ttft, stretch(p.tpot, sharing.decode), ttft + stretch(decode, sharing.decode), p.output,
                      p.remaining, p.quality)  # fmt: skip
