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
from predictor.prefix import PrefixIndex
from predictor.prior import WorkerProfile, changed_profiles, worker_profiles
from predictor.sketch import prefix_hashes, prompt_text, task_text, text_features
from predictor.window import TrainingWindow
from router.core.config import Config, PredictorConfig
from router.core.types import BackendView, RequestFeatures
from router.requestlog import RequestRecord
from router.state.base import PrefixGossip

log = logging.getLogger("chimera.predictor")

MIN_NEW_FOR_REFIT = 100  # completions added since the last refit before another is worth its CPU


class PredictorRuntime:
    def __init__(self, config: Config) -> None:
        self.settings = config.gateway.predictor or PredictorConfig()
        self.profiles: dict[str, WorkerProfile] = worker_profiles(config)
        self.slot = ModelSlot(PriorPredictor())
        self.prefix = PrefixIndex()
        self._share: Callable[[Sequence[int], str], None] | None = None
        self.window = TrainingWindow(self.settings.window)
        self._scores: OrderedDict[str, float] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()  # ids of requests in (or recently in) the window
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
        if record.outcome != "ok" or record.fleet is None or record.e2e_s is None:
            return
        self.window.add(record.to_json())
        self._remember(self._seen, record.request_id, None)

    def feedback(self, request_id: str, score: float) -> bool:
        """Keep ``score`` for the next refit; True if the request is one this gateway still holds."""
        self._remember(self._scores, request_id, score)
        return request_id in self._seen

    def _remember(self, d: OrderedDict[str, Any], key: str, value: Any) -> None:
        d[key] = value
        d.move_to_end(key)
        while len(d) > 2 * self.settings.window:
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
        estimator = await asyncio.to_thread(fit_records, records, scores)
        if self.settings.save:  # before the swap: once live, the loop fills the estimator's caches
            await asyncio.to_thread(artifact.save, estimator, self.settings.save, {"samples": len(records)})
        self.slot.swap(estimator)
        self._fitted_at = added
        self.refits += 1
        log.info("predictor refit #%d on %d completions", self.refits, len(records))
        return True


def fit_records(records: list[dict[str, Any]], scores: dict[str, float] | None = None) -> Predictor:
    """Fit a Predictor on request-log records; one OpenMP thread, so a refit never starves the gateway."""
    data = samples(records, scores)
    if not data:
        raise ValueError("no usable completions to fit on")
    with threadpool_limits(limits=1, user_api="openmp"):
        return Predictor().fit(data)
