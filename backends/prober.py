"""Active health checks: one asyncio task per worker probes ``/health`` and scrapes ``/metrics``.

Each round: ``GET {url}/health`` (ok means 200), then, only if healthy, the worker's metrics by its engine's
names (:mod:`backends.engines`: ``GET {url}/metrics`` but for TensorRT-LLM's ``/prometheus/metrics``, and
LightLLM's KV use from ``/token_load``), parsed by :func:`backends.scrape.parse_metrics`. A worker with no
``engine:`` is read by the names its ``/metrics`` carries (found again whenever they stop parsing). A worker
whose /health is fine but whose metrics fail is still healthy; its metrics just go stale (``metrics_age_s``
grows). Each request is bounded by ``probe_timeout_s`` so a stalled worker cannot stall its prober, and rounds
follow a fixed cadence so a slow probe does not push the next ones back.

A healthy worker's ``GET {url}/v1/models`` is also checked, on its first good probe and then every
``MODEL_CHECK_S``: a worker that lists models but not the configured ``model`` (started with another
``--served-model-name``) would answer every request routed to it with a 404 the caller cannot fix, so
it fails its probes until it serves that name. A worker without a usable /v1/models (an error, not
JSON) is not held to it.

The outcome goes to the fleet state's ``record_probe`` (its :class:`ProbeSink`); ejection and
re-admission are the state's call, so active and passive failures are counted in one place.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence

import httpx2 as httpx

from backends.engines import BY_ENGINE, EngineMetrics, detect, json_load
from backends.scrape import parse_metrics
from router.core import paths
from router.core.config import BackendConfig, HealthConfig
from router.core.errors import ChimeraError, WorkerProtocolError
from router.state.base import ProbeSink, ScrapedMetrics

log = logging.getLogger(__name__)

FIRST_PROBE_SPREAD = 0.25  # the first probe lands within this share of an interval (no lockstep)
MODEL_CHECK_S = 30.0  # a healthy worker's served model names are checked again this often


class Prober:
    """Probes every configured worker until :meth:`close`. The client is injected, not owned."""

    def __init__(
        self,
        backends: Sequence[BackendConfig],
        state: ProbeSink,
        client: httpx.AsyncClient,
        health: HealthConfig,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self._backends = tuple(backends)
        self._state = state
        self._client = client
        self._health = health
        self._rng = rng or random.Random()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_ok: dict[str, bool] = {}
        self._model_ok_at: dict[str, float] = {}  # when each worker last listed its configured model
        self._detected: dict[str, EngineMetrics] = {}  # the engine of each worker without ``engine:``, once seen

    async def start(self) -> None:
        if self._tasks:
            return
        for b in self._backends:
            task = asyncio.create_task(self._run(b), name=f"probe:{b.name}")
            task.add_done_callback(_report_crash)
            self._tasks.append(task)

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def probe_once(self, backend: BackendConfig) -> tuple[bool, ScrapedMetrics | None]:
        """One round against one worker: (health ok, parsed metrics or None). Never raises for a
        worker's failure; those are the expected outcome of a probe."""
        try:
            resp = await self._get(backend, paths.WORKER_HEALTH)
        except (httpx.HTTPError, TimeoutError) as exc:
            self._note(backend, False, f"/health: {_describe(exc)}")
            self._model_ok_at.pop(backend.name, None)
            return False, None
        if resp.status_code != 200:
            self._note(backend, False, f"/health answered {resp.status_code}")
            self._model_ok_at.pop(backend.name, None)  # a restarted worker may serve another model
            return False, None
        wrong = await self._wrong_model(backend)
        if wrong:
            self._note(backend, False, wrong)
            return False, None
        self._note(backend, True, "")
        try:
            return True, await self._scrape(backend)
        except (httpx.HTTPError, TimeoutError, WorkerProtocolError) as exc:
            log.debug("worker %s: metrics unavailable: %s", backend.name, _describe(exc))
            self._detected.pop(backend.name, None)
            return True, None

    async def _scrape(self, backend: BackendConfig) -> ScrapedMetrics:
        spec = BY_ENGINE[backend.engine] if backend.engine else self._detected.get(backend.name)
        if spec is None:
            spec, text = await self._detect(backend)
        else:
            text = await self._text(backend, spec.metrics_path)
        kv = await self._json_kv(backend, spec.kv_json) if spec.kv_json else None
        metrics = parse_metrics(text, spec, kv)
        if backend.engine is None and backend.name not in self._detected:
            log.info("worker %s: %s metrics", backend.name, spec.engine)
            self._detected[backend.name] = spec
        return metrics

    async def _detect(self, backend: BackendConfig) -> tuple[EngineMetrics, str]:
        """The engine a worker without ``engine:`` runs, by the load metrics it exposes, and that text."""
        text = await self._text(backend, paths.WORKER_METRICS)
        spec = detect(text)
        if spec is None:  # TensorRT-LLM answers /metrics with JSON iteration stats, Prometheus elsewhere
            other = BY_ENGINE["trtllm"].metrics_path
            try:
                text = await self._text(backend, other)
            except WorkerProtocolError:
                pass
            spec = detect(text)
        if spec is None:
            raise WorkerProtocolError(f"no known engine's load metrics in {paths.WORKER_METRICS}", backend=backend.name)
        return spec, text

    async def _text(self, backend: BackendConfig, path: str) -> str:
        resp = await self._get(backend, path)
        if resp.status_code != 200:
            raise WorkerProtocolError(f"{path} answered {resp.status_code}", backend=backend.name)
        return resp.text

    async def _json_kv(self, backend: BackendConfig, where: tuple[str, str]) -> float | None:
        """KV use from a JSON endpoint (LightLLM's ``/token_load``); None where it does not say."""
        path, key = where
        try:
            resp = await self._get(backend, path)
            value = json_load(resp.json().get(key)) if resp.status_code == 200 else None
        except (ValueError, AttributeError):
            return None
        return None if value is None or not 0.0 <= value <= 1.5 else value

    async def _wrong_model(self, backend: BackendConfig) -> str:
        """Why the worker does not serve its configured model ("" where it does, or cannot tell)."""
        now = asyncio.get_running_loop().time()
        checked = self._model_ok_at.get(backend.name)
        if checked is not None and now - checked < MODEL_CHECK_S:
            return ""
        try:
            auth = {"authorization": "Bearer " + backend.api_key} if backend.api_key else None
            resp = await self._get(backend, paths.WORKER_MODELS, auth)
            ids = [m["id"] for m in resp.json()["data"]] if resp.status_code == 200 else None
        except (httpx.HTTPError, TimeoutError, ValueError, KeyError, TypeError):
            ids = None
        if ids is not None and backend.model not in ids:
            return f"/v1/models lists {ids}, not the configured model {backend.model!r} (its --served-model-name?)"
        self._model_ok_at[backend.name] = now
        return ""

    async def _run(self, backend: BackendConfig) -> None:
        interval = self._health.probe_interval_s
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self._rng.uniform(0, interval * FIRST_PROBE_SPREAD))
        next_at = loop.time()
        while True:
            # A shared state elects one replica per worker to probe it; the rest read its results.
            if await self._state.should_probe(backend.name):
                ok, metrics = await self.probe_once(backend)
                try:
                    await self._state.record_probe(backend.name, ok, metrics)
                except ChimeraError as exc:  # e.g. a shared state that is briefly unreachable
                    log.warning("worker %s: could not record probe: %s", backend.name, exc)
            # Fixed cadence; a round that overran its slot skips to the next one.
            now = loop.time()
            next_at += interval
            if next_at < now:
                next_at = now + interval - (now - next_at) % interval
            await asyncio.sleep(next_at - now)

    async def _get(self, backend: BackendConfig, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
        timeout = self._health.probe_timeout_s
        # httpx's timeout applies per phase (connect, read...); asyncio.timeout bounds the total.
        async with asyncio.timeout(timeout):
            return await self._client.get(backend.url + path, timeout=timeout, headers=headers)

    def _note(self, backend: BackendConfig, ok: bool, why: str) -> None:
        """Log probe outcome changes only, so a dead worker does not flood the log."""
        if self._last_ok.get(backend.name, True) != ok:
            if ok:
                log.info("worker %s: probes succeed again", backend.name)
            else:
                log.warning("worker %s: probe failed: %s", backend.name, why)
        self._last_ok[backend.name] = ok


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _report_crash(task: asyncio.Task[None]) -> None:
    # Probe failures are handled inside the loop; reaching here means a bug. Make it loud rather
    # than leave a worker silently unprobed (and retrieve the exception so asyncio does not warn).
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("prober task %s died", task.get_name(), exc_info=exc)
