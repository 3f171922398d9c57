"""What the gateway learns of a worker with no profile: its step times and its answers' quality.

A worker whose model has no shipped profile and whose backend names none would otherwise be priced as the
default profile (a 7B on an H200), whatever it is. :class:`StepLearner` instead fits the terms of the prior's
step-time model (:func:`predictor.prior.prior_latency`) to the worker's own timings, in the same features the
prior computes from the fleet view at dispatch:

* **decode**: each answer's time per output token against the batch it joined (``n_run + 1``) and that batch's
  context (``(n_run + 1) x ctx``, ``ctx`` half the in-flight tokens per request) gives ``base``,
  ``decode_seqs`` and ``decode_ctx``;
* **prefill**: its time to first token, less the decode steps it waited for at that batch (the steps its
  prefill took, and the one in progress), against the prompt tokens prefilled (its own uncached ones and
  those queued ahead of it) and their causal attention work gives ``ttft_overhead``, ``prefill`` and ``attn``.

Both are non-negative robust least squares on the last ``window`` answers (``scipy.optimize.least_squares``
with a soft L1 loss, from the ``nnls`` solution), refitted every ``refit_every`` answers at first and every 64
once 512 have come (a refit takes about 2 ms on the answers' own path: about 0.04 ms an answer then). Where the
window's batches lie within ``MIN_BATCH_SPREAD`` of each other, a step's base and its per-sequence cost cannot be
told apart, so the starting profile's decode terms are scaled together instead (by the mean ratio, its tenths at
either end trimmed). Until ``min_samples`` answers have taught it, the worker keeps its starting profile. A
non-streamed answer teaches the decode terms (its e2e less the predicted TTFT, per token) when it is long enough.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from scipy.optimize import least_squares, nnls
from scipy.stats import trim_mean

from predictor.prior import WorkerProfile

MIN_DECODE_TOKENS = 8  # a non-streamed answer this long or longer teaches the decode terms
MAX_REFIT_EVERY = 64  # answers between refits once many have been seen
TRIM = 0.1  # the share of ratios cut at either end of the scaled fit's mean
MIN_BATCH_SPREAD = 8  # batches this far apart in the window fit base and per-sequence terms apart (else one scale)


class StepLearner:
    """One worker's step-time terms, fitted to its answers; :attr:`profile` is what it routes with."""

    def __init__(self, start: WorkerProfile, window: int = 512, min_samples: int = 20, refit_every: int = 8) -> None:
        self.start = start
        self.profile = start
        self.window = window
        self.min_samples = min_samples
        self.refit_every = refit_every
        self._decode: deque[tuple[float, float, float]] = deque(maxlen=window)  # (batch, batch x ctx, TPOT)
        # (n_run, n_run x ctx, decode steps waited, prompt tokens prefilled, attention work, TTFT)
        self._prefill: deque[tuple[float, float, float, float, float, float]] = deque(maxlen=window)
        self._since = 0
        self.samples = 0
        self.fits = 0

    @property
    def learned(self) -> bool:
        return self.fits > 0

    def observe(
        self, fleet: Mapping[str, Any], prompt_tokens: int, cached: float, output_tokens: int | None,
        ttft_s: float | None, e2e_s: float | None,
    ) -> bool:  # fmt: skip
        """Learn from one finished answer: ``fleet``, the worker's view at dispatch (the request log's ``fleet``),
        its prompt and cached share, and what it took (``ttft_s`` None for a non-streamed answer). True when the
        terms were refitted."""
        wp = self.profile
        n = max((fleet.get("running") or 0) + (fleet.get("waiting") or 0), fleet.get("inflight_requests") or 0)
        n_run = min(n, wp.max_num_seqs)
        inflight = fleet.get("inflight_requests") or 0
        per_req = (fleet.get("inflight_tokens") or 0) / inflight if inflight else float(prompt_tokens)
        ctx = 0.5 * per_req
        own = prompt_tokens * (1.0 - cached)
        ahead = max((n - n_run) * 0.5 * per_req, float(fleet.get("pending_prefill_tokens") or 0))
        budget = max(1.0, wp.max_num_batched_tokens - n_run)
        steps = max(1, math.ceil((own + ahead) / budget))
        attn = own * (prompt_tokens - own + own / 2) / 1e6
        tokens = output_tokens or 0
        taught = False
        if ttft_s is not None and e2e_s is not None and tokens >= 2 and e2e_s > ttft_s > 0:
            self._decode.append((n_run + 1.0, (n_run + 1.0) * ctx, (e2e_s - ttft_s) / (tokens - 1)))
            waits = steps + (1.0 if n_run else 0.0)
            self._prefill.append((float(n_run), n_run * ctx, waits, own + ahead, attn, ttft_s))
            taught = True
        elif ttft_s is None and e2e_s is not None and tokens >= MIN_DECODE_TOKENS:
            first = self._ttft(n_run, n_run * ctx, steps + (1.0 if n_run else 0.0), own + ahead, attn)
            if e2e_s > first:
                self._decode.append((n_run + 1.0, (n_run + 1.0) * ctx, (e2e_s - first) / (tokens - 1)))
                taught = True
        if not taught:
            return False
        self.samples += 1
        self._since += 1
        # every refit_every answers at first, then every eighth of those seen (at most MAX_REFIT_EVERY): a refit
        # costs about 2 ms, so once the terms have settled it is paid rarely
        every = min(MAX_REFIT_EVERY, max(self.refit_every, self.samples // 8))
        if self.samples < self.min_samples or self._since < every:
            return False
        self._since = 0
        return self.refit()

    def _ttft(self, n_run: float, run_ctx: float, waits: float, tokens: float, attn: float) -> float:
        wp = self.profile
        decode_lin = wp.base + wp.decode_seqs * n_run + wp.decode_ctx * run_ctx
        return wp.ttft_overhead + waits * decode_lin + wp.prefill * tokens + wp.attn * attn

    def refit(self) -> bool:
        """Refit the terms on the window; False where the answers do not determine them yet."""
        if len(self._decode) < 3:
            return False
        d = np.asarray(self._decode)
        y = d[:, 2]
        if np.ptp(d[:, 0]) >= MIN_BATCH_SPREAD:  # batches far enough apart to tell a step's base from its batch
            base, seqs, per_ctx = _robust_fit(np.column_stack([np.ones(len(d)), d[:, 0], d[:, 1]]), y)
        else:  # the starting profile's decode model, scaled to fit
            s = self.start
            k = float(trim_mean(y / (s.base + s.decode_seqs * d[:, 0] + s.decode_ctx * d[:, 1]), TRIM))
            base, seqs, per_ctx = k * s.base, k * s.decode_seqs, k * s.decode_ctx
        if not (base > 0 or seqs > 0):
            return False
        wp = self.profile
        overhead, prefill, attn = wp.ttft_overhead, wp.prefill, wp.attn
        if len(self._prefill) >= 3:
            p = np.asarray(self._prefill)
            # the decode steps its prefill and the step in progress took, at the batch it found
            rest = p[:, 5] - p[:, 2] * (base + seqs * p[:, 0] + per_ctx * p[:, 1])
            keep = rest > 0
            if keep.sum() >= 3:
                p, rest = p[keep], rest[keep]
                overhead, prefill, attn = _robust_fit(np.column_stack([np.ones(len(p)), p[:, 3], p[:, 4]]), rest)
        self.profile = replace(wp, base=base, decode_seqs=seqs, decode_ctx=per_ctx, ttft_overhead=overhead,
                               prefill=prefill, attn=attn)  # fmt: skip
        self.fits += 1
        return True


def _robust_fit(a: np.ndarray, y: np.ndarray) -> tuple[float, ...]:
    """Non-negative terms ``t`` with ``a @ t`` close to ``y``: least squares in units of ``y``'s median, with a soft
    L1 loss, so that a stalled answer or one whose tokens arrived in one burst moves them little."""
    scale = float(np.median(y)) or 1.0
    start, _ = nnls(a, y)
    fit = least_squares(lambda t: (a @ t - y) / scale, start, bounds=(0.0, np.inf), loss="soft_l1", f_scale=0.5)
    return tuple(float(v) for v in fit.x)


def learned_start(template: WorkerProfile, name: str) -> WorkerProfile:
    """The profile a worker with none starts from: ``template``'s limits and terms (until its own answers replace
    the step-time terms), under ``name``, with what the linear model cannot learn from answers switched off (the
    eager CUDA-graph step, the API server's streaming and intake terms): a worker's own timings carry them."""
    return replace(
        template, name=name, busy_wait_steps=1.0, stream_token=0.0, stream_wait=0.0, intake=0.0, intake_token=0.0,
        graph_max=0, eager_floor=0.0, eager_extra=0.0, eager_token=0.0, prefill_extra=0.0,
    )  # fmt: skip


class QualityTally:
    """A model's answer quality from the verdicts posted for its answers (``POST /v1/feedback``), where nobody
    declared it: ``(good + strength x prior) / (rated + strength)``.

    The prior is optimistic (``prior`` 1.0 by default: every unrated model looks as good as any), so the expected-cost
    rule tries each model until its verdicts say what it is worth; ``strength`` pseudo-verdicts set how fast they
    do. A declared ``quality`` is refined the same way, from the declared level.
    """

    def __init__(self, prior: float = 1.0, strength: float = 4.0) -> None:
        self.prior = prior
        self.strength = strength
        self.good = 0.0
        self.rated = 0

    def add(self, score: float) -> float:
        """One verdict (1 good, 0 bad, or a score between); the new estimate."""
        self.good += min(1.0, max(0.0, score))
        self.rated += 1
        return self.value

    @property
    def value(self) -> float:
        return (self.good + self.strength * self.prior) / (self.rated + self.strength)


class Unprofiled:
    """The workers with no profile, as one gateway learns them: each one's :class:`StepLearner`, a
    :class:`QualityTally` per model and per (agent, model), and what the policy reads of them, kept up to date in
    place: ``profiles`` (by backend: the learned terms, and the model's quality over every agent) and
    ``agent_quality`` (by ``(agent, backend)``: the quality of that agent's answers there,
    :class:`predictor.model.PriorPredictor`'s ``quality``).

    ``workers``: ``(backend, model, declared quality or None)`` of each such worker; ``profiles`` holds every
    backend's profile (the others are left alone).
    """

    def __init__(
        self, profiles: dict[str, WorkerProfile], workers: Sequence[tuple[str, str, float | None]],
        declared_strength: float = 20.0,
    ) -> None:  # fmt: skip
        self.profiles = profiles
        self.agent_quality: dict[tuple[str, str], float] = {}
        self.steps: dict[str, StepLearner] = {}
        self._model_of: dict[str, str] = {}
        self._declared: dict[str, float | None] = {}
        self._strength = declared_strength
        self.models: dict[str, QualityTally] = {}
        self._agents: dict[tuple[str, str], QualityTally] = {}
        for name, model, declared in workers:
            declared = self._declared.setdefault(model, declared)  # a model's first backend declares for all
            tally = self.models.get(model) or self.models.setdefault(model, self._tally(declared))
            self.profiles[name] = replace(learned_start(profiles[name], f"learned:{name}"), quality=tally.value)
            self.steps[name] = StepLearner(self.profiles[name])
            self._model_of[name] = model

    def _tally(self, declared: float | None) -> QualityTally:
        return QualityTally() if declared is None else QualityTally(declared, self._strength)

    def __contains__(self, backend: str) -> bool:
        return backend in self.steps

    def progress(self, backend: str) -> dict[str, Any]:
        """How far ``backend`` has been learned: answers timed, step-time fits, verdicts on its model, and its
        model's quality so far."""
        learner, model = self.steps[backend], self._model_of[backend]
        tally = self.models[model]
        return {"learned_answers": learner.samples, "learned_fits": learner.fits, "verdicts": tally.rated,
                "quality": round(tally.value, 4)}  # fmt: skip

    def answer(
        self, backend: str, fleet: Mapping[str, Any], prompt_tokens: int, cached: float, output_tokens: int | None,
        ttft_s: float | None, e2e_s: float | None,
    ) -> None:  # fmt: skip
        """One finished answer of ``backend`` (see :meth:`StepLearner.observe`)."""
        learner = self.steps.get(backend)
        if learner is not None and learner.observe(fleet, prompt_tokens, cached, output_tokens, ttft_s, e2e_s):
            self.profiles[backend] = replace(learner.profile, quality=self.profiles[backend].quality)

    def verdict(self, agent: str, backend: str, score: float) -> None:
        """One verdict on an answer ``backend`` gave ``agent``: its model's tallies move, for every worker of it."""
        model = self._model_of.get(backend)
        if model is None:
            return
        pooled = self.models[model].add(score)
        key = (agent, model)
        tally = self._agents.get(key)
        if tally is None:
            tally = self._agents[key] = self._tally(self._declared[model])
        q = tally.add(score)
        for name, m in self._model_of.items():
            if m == model:
                self.profiles[name] = replace(self.profiles[name], quality=pooled)
                self.agent_quality[(agent, name)] = q
