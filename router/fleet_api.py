"""The gateway's own endpoints: /health, /ready, /metrics and /fleet.

/health and /ready stay open for probes; /metrics and /fleet need ``gateway.admin_key`` where one is set.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from predictor import fleetview
from predictor.prior import worker_profiles
from router.core.errors import NoHealthyWorker
from router.core.types import BackendView
from router.gateway import Gateway, gateway_of
from router.state.base import StateInfo


async def health(request: Request) -> JSONResponse:
    """The gateway process is up (says nothing about workers)."""
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> JSONResponse:
    """200 once at least one worker is healthy and has answered (a probe or a request)."""
    snapshot = gateway_of(request).state.snapshot()
    up = [b.name for b in snapshot.backends if b.healthy and b.last_success_age_s is not None]
    if not up:
        answered = any(b.last_success_age_s is not None for b in snapshot.backends)
        raise NoHealthyWorker("no worker is healthy" if answered else "no worker is healthy yet")
    return JSONResponse({"status": "ready", "healthy_backends": up})


async def metrics(request: Request) -> Response:
    gw = gateway_of(request)
    gw.agents.check_admin(request.headers)
    gw.metrics.refresh(gw.state.snapshot())
    gw.metrics.refresh_state(gw.state)
    body, content_type = gw.metrics.render()
    return Response(body, media_type=content_type)


async def fleet(request: Request) -> JSONResponse:
    gw = gateway_of(request)
    gw.agents.check_admin(request.headers)
    views = gw.state.snapshot().backends
    state: StateInfo = gw.state  # what /fleet reports of the state itself
    predicted, source = _predictions(gw, views)
    body: dict[str, Any] = {
        "state": "degraded" if state.degraded else state.kind,
        "policy": gw.policy_name,
        "backends": [_backend_json(b, predicted.get(b.name, {})) | _learned(gw, b.name) for b in views],
        "predicted_for": {**fleetview.reference(), "by": source},
    }
    if replicas := state.replicas():  # a shared state: every replica's share of inflight_*
        body["replicas"] = [
            {"id": r.id, "self": r.is_self, "inflight_requests": r.inflight_requests,
             "inflight_tokens": r.inflight_tokens}
            for r in replicas
        ]  # fmt: skip
    return JSONResponse(body)


def _predictions(gw: Gateway, views: tuple[BackendView, ...]) -> tuple[dict[str, dict[str, float]], str]:
    """Each worker's predicted latency for the reference request: the gateway's predictor's where it
    has one, else the analytic prior of the workers' profiles."""
    if gw.predictor is not None:
        return gw.predictor.fleet_predictions(views)
    return fleetview.prior_predictions(views, worker_profiles(gw.config)), "prior"


def _learned(gw: Gateway, name: str) -> dict[str, Any]:
    """What the gateway's predictor routes a worker with: its profile's name and, for a worker with no profile,
    how many of its answers and verdicts taught it (:mod:`predictor.online`)."""
    return gw.predictor.learned_of(name) if gw.predictor is not None else {}


def _backend_json(b: BackendView, predicted: dict[str, float]) -> dict[str, Any]:
    return {
        "name": b.name,
        "model": b.model,
        "healthy": b.healthy,
        "inflight_requests": b.inflight_requests,
        "inflight_tokens": b.inflight_tokens,
        "pending_prefill_tokens": b.pending_prefill_tokens,  # streamed prompts awaiting a first token (all replicas')
        "kv_budget_tokens": b.kv_budget_tokens,
        "kv_usage": b.kv_usage,
        "running": b.running,
        "waiting": b.waiting,
        "consecutive_failures": b.consecutive_failures,
        "metrics_age_s": b.metrics_age_s,
        "last_success_age_s": b.last_success_age_s,
        "ttft_ewma_ms": None if b.ttft_ewma_s is None else b.ttft_ewma_s * 1000.0,
        "tpot_ewma_ms": None if b.tpot_ewma_s is None else b.tpot_ewma_s * 1000.0,
        "ttft_bias": b.ttft_bias,  # observed / predicted on this worker's recent requests (predictive policy)
        "tpot_bias": b.tpot_bias,
        "predicted_ttft_ms": predicted.get("ttft_ms"),  # for the reference request: body["predicted_for"]
        "predicted_tpot_ms": predicted.get("tpot_ms"),
        "predicted_e2e_ms": predicted.get("e2e_ms"),
        "tags": sorted(b.tags),
        "gpu": b.gpu,  # host/gpu: workers with the same one time-share that GPU
        "engine": b.engine,  # vllm, sglang, tgi, trtllm or lightllm: configured, else read from its metrics
    }
