"""The predictor inside a gateway: per-request text features, the prefix index, and online refits.

:class:`PredictorRuntime` is created by ``create_app`` when the policy is ``predictive`` or
``gateway.predictor`` is configured. Per request it

* ``enrich``: computes the prompt's sketch, task terms and prefix hashes once, looks the hashes up in the local
  :class:`PrefixIndex` (-> ``features.prefix_hits``) and notes the sketch in the request record;
* ``dispatched``: records the prompt's blocks against the chosen worker (and shares what is new
  to the index with the other gateways, through the fleet state: ``share_through``) and returns
  what the log needs to rebuild the worker's features (profile, time scale, expected prefix share);
* ``observe``: adds the finished request to the bounded, load-bucketed training window;
* ``feedback``: keeps a quality score for a recent request id.

A worker with no profile (none configured, none shipped for its model: ``profile_choice``'s "default") borrows
no one's: its step-time terms are learned from its own answers (:class:`predictor.online.StepLearner`, refitted
every few answers on the answers' path) and its answer quality from the verdicts posted for its model
(:class:`predictor.online.QualityTally`, from the backend's declared ``quality`` where it has one, else from an
optimistic prior that makes the policy try it). Both land in ``profiles``, which the policy reads at every
decision (``slot.profiles``) and the refits train on.

In the background, every ``refit_interval_s`` it refits a :class:`Predictor` on the window in a
worker thread (never on the event loop; the decision path never fits), swaps it into the policy's
:class:`ModelSlot`, and optionally saves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from threadpoolctl import threadpool_limits

from predictor import artifact, fleetview
from predictor.dataset import samples
from predictor.model import ModelSlot, Predictor, PriorPredictor
from predictor.online import Unprofiled
from predictor.prefix import PrefixIndex
from predictor.prior import WorkerProfile, changed_profiles, profile_choice, worker_profiles
from predictor.sharing import unshared
from predictor.sketch import prefix_hashes, prompt_text, task_text, text_features
from predictor.window import TrainingWindow
from router.core.config import Config, PredictorConfig
from router.core.types import BackendView, RequestFeatures
from router.requestlog import RequestRecord
from router.state.base import PrefixGossip

log = logging.getLogger("chimera.predictor")

MIN_NEW_FOR_REFIT = 100  # completions added since the last refit before another is worth its CPU
DECLARED_QUALITY_STRENGTH = 20.0  # pseudo-verdicts behind a declared quality (an undeclared one: QualityTally's)


class PredictorRuntime:
    def __init__(self, config: Config) -> None:
        self.settings = config.gateway.predictor or PredictorConfig()
        self.profiles: dict[str, WorkerProfile] = worker_profiles(config)
        unknown = [(b.name, b.model, b.quality) for b in config.backends
                   if profile_choice(b.profile_name, b.model)[1] == "default"]  # fmt: skip
        self.unprofiled = Unprofiled(self.profiles, unknown, DECLARED_QUALITY_STRENGTH)
        self.slot = ModelSlot(PriorPredictor(self.unprofiled.agent_quality), self.profiles)
        self.prefix = PrefixIndex()
        self._share: Callable[[Sequence[int], str], None] | None = None
        self.window = TrainingWindow(self.settings.window)
        self._scores: OrderedDict[str, float] = OrderedDict()
        # verdicts on ids not seen yet (an answer still streaming), by id -> (agent, score): apart, and smaller, so
        # made-up ids cannot push real verdicts out of _scores
        self._early: OrderedDict[str, tuple[str, float]] = OrderedDict()
        # ids of requests in (or recently in) the window -> (agent, backend); those whose verdict was counted
        self._seen: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._tallied: OrderedDict[str, None] = OrderedDict()
        self._fitted_at = 0
        self._task: asyncio.Task[None] | None = None
        self.refits = 0

    def share_through(self, state: PrefixGossip) -> None:
        """Exchange prefix-index news with the other gateways on ``state`` (a no-op for memory)."""
        self._share = state.share_prefix
        state.on_shared_prefix(self._learn_shared)

    def _learn_shared(self, hashes: Sequence[int], backend: str) -> None:
        self.prefix.record(hashes, backend)

    def fleet_predictions(self, views: Sequence[BackendView]) -> tuple[dict[str, dict[str, float]], str]:
        """``/fleet``'s predicted latency per worker (:mod:`predictor.fleetview`), and by what: "learned"
        or "prior"."""
        source = "prior" if isinstance(self.slot.current, PriorPredictor) else "learned"
        return fleetview.slot_predictions(self.slot, views, self.profiles), source

    def learned_of(self, backend: str) -> dict[str, Any]:
        """``/fleet``'s word on ``backend``'s profile: its name, and for a worker with no profile (named
        ``learned:<backend>``) the answers its step times were fitted on and the verdicts on its model."""
        wp = self.profiles.get(backend)
        out: dict[str, Any] = {"profile": wp.name if wp else None}
        if backend in self.unprofiled:
            out.update(self.unprofiled.progress(backend))
        return out

    async def start(self) -> None:
        if self.settings.model:
            estimator, header = await asyncio.to_thread(artifact.load, self.settings.model)
            self.slot.swap(estimator)
            log.info("predictor %s loaded (%s samples)", self.settings.model, header.get("meta", {}).get("samples"))
            changed = changed_profiles(getattr(estimator, "profiles_", {}), self.profiles)
            if changed:  # it still routes, on prior features it was not fitted on: say so once, at start
                log.warning("predictor %s was trained on other terms of profile %s than this config's: its latency "
                            "predictions may be off until it is retrained (`chimera predictor train`)",
                            self.settings.model, ", ".join(changed))  # fmt: skip
        if self.settings.refit_interval_s > 0:
            self._task = asyncio.create_task(self._refit_loop(), name="predictor-refit")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- per request --

    def enrich(self, features: RequestFeatures, endpoint: str, payload: Any, record: RequestRecord) -> RequestFeatures:
        text = prompt_text(endpoint, payload)
        sk, terms = text_features(text, task_text(endpoint, payload))
        hashes = prefix_hashes(text)
        # The log's sketch: the 64 dense values, then the task's term ids (predictor.dataset splits them).
        record.sketch = [round(x, 4) for x in sk] + [float(t) for t in terms]
        hits = self.prefix.shares(hashes, features.prompt_tokens)
        return dataclasses.replace(features, sketch=sk, terms=terms, prefix_hashes=hashes, prefix_hits=hits)

    def dispatched(self, features: RequestFeatures, backend: str) -> dict[str, Any]:
        depth = self.prefix.record(features.prefix_hashes, backend)
        if depth and self._share is not None:
            self._share(features.prefix_hashes[:depth], backend)
        wp = self.profiles.get(backend)
        return {
            "profile": wp.name if wp else None,
            "time_scale": wp.time_scale if wp else 1.0,
            "prefix_share": round(features.prefix_hits.get(backend, 0.0), 4),
        }

    def observe(self, record: RequestRecord) -> None:
        if record.outcome != "ok" or record.fleet is None or record.e2e_s is None or record.backend is None:
            return
        who = (record.agent or "", record.backend)
        owner = self._seen.get(record.request_id)
        if owner is not None and owner[0] != who[0]:
            return  # another agent's request has this id (a caller chose it): the first keeps it, this is not learned
        self.window.add(record.to_json())
        self._remember(self._seen, record.request_id, who)
        early = self._early.pop(record.request_id, None)
        if early is not None and early[0] == who[0]:
            self._remember(self._scores, record.request_id, early[1])
        if record.backend in self.unprofiled:
            fleet, waited = record.fleet, record.queue_wait_s or 0.0  # the worker's timings: from when it was sent
            ttft = record.ttft_s - waited if record.ttft_s is not None else None
            ttft, e2e, _ = unshared(record.predicted, ttft, record.e2e_s - waited)  # as it would run alone on its GPU
            share = float(fleet.get("prefix_share") or 0.0)
            self.unprofiled.answer(record.backend, fleet, record.prompt_tokens or 0, share, record.completion_tokens,
                                   ttft, e2e)  # fmt: skip
            score = self._scores.get(record.request_id)
            if score is not None:  # its verdict came before its answer was done
                self._verdict(record.request_id, who, score)

    def feedback(self, request_id: str, score: float, agent: str) -> bool | None:
        """Keep ``agent``'s ``score`` on its request for the next refit: True if this gateway holds that request,
        False if it does not (yet: the verdict waits, apart, for its answer), None if the request is another
        agent's (the verdict is dropped: one tenant cannot grade another's answers)."""
        who = self._seen.get(request_id)
        if who is None:
            self._remember(self._early, request_id, (agent, score), limit=max(16, self.settings.window // 8))
            return False
        if who[0] != agent:
            return None
        self._remember(self._scores, request_id, score)
        self._verdict(request_id, who, score)
        return True

    def _verdict(self, request_id: str, who: tuple[str, str], score: float) -> None:
        """A verdict on a worker with no profile counts towards its model's quality once."""
        if who[1] in self.unprofiled and request_id not in self._tallied:
            self._remember(self._tallied, request_id, None)
            self.unprofiled.verdict(who[0], who[1], score)

    def _remember(self, d: OrderedDict[str, Any], key: str, value: Any, limit: int | None = None) -> None:
        d[key] = value
        d.move_to_end(key)
        while len(d) > (limit if limit is not None else 2 * self.settings.window):
            d.popitem(last=False)

    # -- refits --

    async def _refit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.refit_interval_s)
            try:
                await self.refit()
            except (ValueError, ArithmeticError, OSError) as exc:  # keep serving on the last good model
                log.warning("predictor refit failed: %s", exc)

    async def refit(self, force: bool = False) -> bool:
        """Refit on the window now (in a thread); False when there is too little (new) data."""
        added = self.window.added
        enough = len(self.window) >= self.settings.min_samples and added - self._fitted_at >= MIN_NEW_FOR_REFIT
        if not (enough or (force and len(self.window) > 0)):
            return False
        records, scores = self.window.records(), dict(self._scores)
        estimator = await asyncio.to_thread(fit_records, records, scores, dict(self.profiles))
        if self.settings.save:  # before the swap: once live, the loop fills the estimator's caches
            await asyncio.to_thread(artifact.save, estimator, self.settings.save, {"samples": len(records)})
        self.slot.swap(estimator)
        self._fitted_at = added
        self.refits += 1
        log.info("predictor refit #%d on %d completions", self.refits, len(records))
        return True


def fit_records(
    records: list[dict[str, Any]],
    scores: dict[str, float] | None = None,
    profiles: dict[str, WorkerProfile] | None = None,
) -> Predictor:
    """Fit a Predictor on request-log records (``profiles``: the gateway's own, by backend, where they differ from
    the logged names'); one OpenMP thread, so a refit never starves the gateway."""
    data = samples(records, scores, profiles)
    if not data:
        raise ValueError("no usable completions to fit on")
    with threadpool_limits(limits=1, user_api="openmp"):
        return Predictor().fit(data)
