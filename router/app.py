"""The gateway application: wiring only.

``create_app(config)`` builds a Starlette app whose lifespan creates (or takes injected) the
shared objects and holds them in lifespan state as one :class:`router.gateway.Gateway`:

    workers   one pooled httpx.AsyncClient behind backends.client.WorkerClient
    state     the FleetState that gateway.state names (memory, redis)
    prober    active health checks (unless ``probe=False``)
    policy    resolved by name once, here
    metrics   a per-app Prometheus registry
    log       the JSON-lines request log

Injected objects (``http_client``, ``state``) belong to the caller, who starts and closes them;
what the lifespan creates, it closes. ClientErrors and Starlette's 404/405 leave as OpenAI's error
envelope; anything unexpected as a 500 envelope. While the app serves, the garbage collector is
tuned for it (:func:`serving_gc`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import httpx2 as httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backends.client import WorkerClient, make_http_client, worker_transport
from backends.prober import Prober
from router import edge, feedback, fleet_api, openapi
from router.admission import AdmissionController
from router.auth import AgentResolver
from router.core import paths
from router.core.config import Config
from router.core.errors import ClientError
from router.core.types import Policy
from router.gateway import STATE_KEY, Gateway
from router.metrics import Metrics
from router.middleware import RequestContextMiddleware
from router.passthrough import Passthrough, get_version
from router.policies import USES_PREDICTOR, create_policy
from router.priority import make_priority
from router.requestlog import RequestLog
from router.state import create_state
from router.state.base import FleetState

if TYPE_CHECKING:
    from router.learning import PredictorRuntime


def create_app(
    config: Config,
    *,
    http_client: httpx.AsyncClient | None = None,
    state: FleetState | None = None,
    policy: Policy | None = None,
    probe: bool = True,
) -> Starlette:
    runtime = _predictor_runtime(config) if policy is None or config.gateway.predictor is not None else None
    chosen = policy or _policy(config, runtime)
    policy_name = config.gateway.policy if policy is None else _name_of(policy, config.gateway.policy)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[Mapping[str, Any]]:
        async with contextlib.AsyncExitStack() as stack:
            client, direct = http_client, None
            if client is None:  # the gateway's own: its requests to workers go straight through the transport
                direct = worker_transport()
                client = make_http_client(config.gateway.timeouts, direct)
                stack.push_async_callback(client.aclose)
            fleet = state or create_state(config)
            if runtime is not None:
                runtime.share_through(fleet)  # before start: a shared state then reads news from its start
            if state is None:
                await fleet.start()
                stack.push_async_callback(fleet.close)
            if probe:
                prober = Prober(config.backends, fleet, client, config.gateway.health)
                await prober.start()
                stack.push_async_callback(prober.close)
            request_log = RequestLog(config.gateway.request_log)
            await request_log.start()
            stack.push_async_callback(request_log.close)
            if runtime is not None:
                await runtime.start()
                stack.push_async_callback(runtime.close)
            gateway = Gateway(
                config=config,
                workers=WorkerClient(client, config.gateway.timeouts, direct, config.gateway.max_response_bytes,
                                     config.gateway.max_buffered_bytes),
                state=fleet,
                policy=chosen,
                policy_name=policy_name,
                metrics=Metrics(),
                log=request_log,
                agents=AgentResolver(config),
                predictor=runtime,
            )
            if config.gateway.admission is not None:
                gateway.admission = AdmissionController(config, fleet, chosen, gateway.metrics)
                stack.push_async_callback(gateway.admission.close)
            if any(b.scheduling_policy == "priority" for b in config.backends):
                gateway.engine_priority = make_priority(config.gateway.engine_priority)
            if gateway.metrics.multiprocess and fleet.kind != "memory":
                # `--workers N`: a scrape sums every process's counters from their files, so each process brings
                # its state's counters (kept as plain ints) up to date on its own, not only when it is scraped
                await stack.enter_async_context(_every(STATE_COUNTERS_S, lambda: gateway.metrics.refresh_state(fleet)))
            stack.enter_context(serving_gc())
            yield {STATE_KEY: gateway}

    routes = [
        Route(paths.CHAT_COMPLETIONS, edge.Completion("chat"), methods=["POST"]),
        Route(paths.COMPLETIONS, edge.Completion("completions"), methods=["POST"]),
        Route(paths.RESPONSES, edge.Completion("responses"), methods=["POST"]),
        Route(paths.TOKENIZE, Passthrough(paths.TOKENIZE), methods=["POST"]),
        Route(paths.DETOKENIZE, Passthrough(paths.DETOKENIZE), methods=["POST"]),
        Route(paths.EMBEDDINGS, Passthrough(paths.EMBEDDINGS), methods=["POST"]),
        Route(paths.VERSION, get_version, methods=["GET"]),
        Route(paths.MODELS, edge.list_models, methods=["GET"]),
        Route(paths.MODELS + "/{model:path}", edge.get_model, methods=["GET"]),
        Route(paths.FEEDBACK, feedback.post_feedback, methods=["POST"]),
        Route(paths.HEALTH, fleet_api.health, methods=["GET"]),
        Route(paths.READY, fleet_api.ready, methods=["GET"]),
        Route(paths.METRICS, fleet_api.metrics, methods=["GET"]),
        Route(paths.FLEET, fleet_api.fleet, methods=["GET"]),
        Route(paths.OPENAPI, openapi.openapi_json, methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(RequestContextMiddleware), Middleware(edge.CompletionLane)],
        exception_handlers={
            ClientError: _client_error,
            HTTPException: _http_error,
            ClientDisconnect: _client_gone,
            Exception: _server_error,
        },
        lifespan=lifespan,
    )


log = logging.getLogger(__name__)
STATE_COUNTERS_S = 1.0  # `--workers N`: how often each process publishes its Redis counters to the shared files


@contextlib.asynccontextmanager
async def _every(interval_s: float, fn: Callable[[], None]) -> AsyncIterator[None]:
    """``fn()`` every ``interval_s`` seconds, in a task, and once more when the block ends."""

    def call() -> None:
        try:
            fn()
        except Exception:  # a failed publication is logged; the next one still runs
            log.exception("periodic %s failed", getattr(fn, "__name__", "task"))

    async def loop() -> None:
        while True:
            await asyncio.sleep(interval_s)
            call()

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        call()  # what happened since the last one


YOUNG_GC_THRESHOLD = 7000  # Python's default is 700


@contextlib.contextmanager
def serving_gc() -> Iterator[None]:
    """The process's garbage collector while a gateway serves: what exists at start-up frozen out of
    its passes, and a young generation ten times the default. A request's objects hold no cycles and
    are freed by reference counting, but under the default threshold those of the requests in flight
    set off a young collection every other request and get promoted, which soon brings a full pass
    over every object of the process: ~12 % of the gateway's CPU and 20-60 ms pauses at 2k requests/s
    (docs/benchmarks.md, "Gateway overhead"). Undone on exit (the collector is process-wide)."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(before[0] and max(before[0], YOUNG_GC_THRESHOLD), *before[1:])  # 0: collection is off
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def _predictor_runtime(config: Config) -> PredictorRuntime | None:
    """The gateway's predictor: for the predictive policy, or wherever ``gateway.predictor`` asks for one
    (so that any policy's request log carries what the predictor trains on)."""
    if config.gateway.policy not in USES_PREDICTOR and config.gateway.predictor is None:
        return None
    from router.learning import PredictorRuntime

    return PredictorRuntime(config)


def _policy(config: Config, runtime: PredictorRuntime | None) -> Policy:
    return create_policy(config, runtime.slot if runtime is not None else None)


def _name_of(policy: Policy, default: str) -> str:
    name = getattr(policy, "name", None) or getattr(policy, "__name__", None)
    return name if isinstance(name, str) and name != "<lambda>" else default


async def _client_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ClientError)
    return edge.client_error_response(exc)


async def _client_gone(request: Request, exc: Exception) -> Response:
    # The caller hung up while sending its body: nobody reads this; the request log says 499.
    return Response(status_code=499)


_ROUTE_ERRORS = {404: "unknown_url", 405: "method_not_allowed"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": _ROUTE_ERRORS.get(exc.status_code)}}  # fmt: skip
    return JSONResponse(body, exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    # Starlette re-raises after this response, so the server logs the traceback.
    body = {"error": {"message": "internal error in the gateway", "type": "internal_error", "param": None,
                      "code": "internal_error"}}  # fmt: skip
    return JSONResponse(body, 500)
