"""vLLM's other endpoints that clients call, beside the completions.

``POST /tokenize``, ``/detokenize`` and ``/v1/embeddings`` go to a healthy worker serving the model the body
names (``auto`` or the agent's name: the agent's first model), the least busy first, and are retried on the
next one before the first byte as a completion is; the answer is passed through, a worker's own 4xx in the
gateway's envelope. They reserve no load and take no routing decision: tokenizing is the worker's API
server's work, and an embedding model serves no completions. They take from the agent's rate limits as a completion
does (one request; an embedding's input as tokens), and a request refused for what it sent costs one request.
An embedding is GPU work: it holds its input's tokens on its worker while it runs (the fleet's load, as a completion's
reservation), and under ``gateway.admission`` it goes only to a worker with room for them at its agent's priority,
else 429 ``overloaded`` at once (it is not queued).
``GET /version`` is the gateway's own.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backends.client import MAX_ERROR_BODY
from router.core import paths
from router.core.asgi import Receive, Scope, Send
from router.core.config import AUTO_MODEL, BackendConfig
from router.core.errors import BadRequest, NoHealthyWorker, Overloaded, WorkerError
from router.edge import _json, request_body
from router.features import resolve_models
from router.gateway import Gateway, gateway_of
from router.promptlen import prompt_counts
from router.proxy import client_error, worker_error_envelope
from router.ratelimit import REFUSED, charge, charge_refused

try:
    VERSION = version("chimera-router")
except PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "0+unknown"

MAX_BODY_BYTES = 1024 * 1024


async def get_version(request: Request) -> JSONResponse:
    """GET /version: the gateway's version, as vLLM answers its own."""
    return JSONResponse({"version": VERSION})


def _input_tokens(gw: Gateway, payload: dict[str, Any], models: tuple[str, ...]) -> int:
    """An embedding request's ``input`` in tokens: token ids counted, text estimated as a prompt is."""
    given = payload.get("input")
    items = given if isinstance(given, list) else [given]
    if items and all(isinstance(t, int) for t in items):
        return len(items)
    text = "\n".join(t for t in items if isinstance(t, str))
    exact = sum(len(t) for t in items if isinstance(t, list))
    return gw.prompt_lengths.estimate(prompt_counts(text, exact=exact), models)


class Passthrough:
    """A POST endpoint passed to a worker serving the body's model (see the module's docstring), as an ASGI app."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.answer(Request(scope, receive))
        await response(scope, receive, send)

    async def answer(self, request: Request) -> Response:
        gw = gateway_of(request)
        named = gw.agents.named(request.headers)
        limit = min(MAX_BODY_BYTES, gw.config.gateway.max_body_bytes)
        payload = _json(await request_body(request.receive, request.headers.get("content-length"), limit))
        model = payload.get("model") if isinstance(payload, dict) else None
        try:
            if not isinstance(model, str) or not model:
                raise BadRequest("you must provide a model parameter", param="model",
                                 code="missing_required_parameter")  # fmt: skip
            agent = gw.agents.settle(named, model)
            models = resolve_models(gw.config, agent, model)
        except REFUSED:
            await charge_refused(gw, named)
            raise
        # the same buckets as completions: one request, and an embedding's input as tokens (the worker's GPU work)
        gpu_work = self.path == paths.EMBEDDINGS
        tokens = _input_tokens(gw, payload, models) if gpu_work else 0
        await charge(gw, agent, tokens)
        if model == AUTO_MODEL or model == agent.name:
            models = models[:1]  # a tokenizer is the model's own: "auto" means the agent's first
        views = sorted((v for v in gw.state.snapshot().backends if v.healthy and v.model in models),
                       key=lambda v: v.inflight_requests)  # fmt: skip
        if not views:
            raise NoHealthyWorker(f"no healthy worker serves {', '.join(models)}")
        if gpu_work and gw.admission is not None:
            views = [v for v in views if gw.admission.has_room(v, tokens, agent.priority)]
            if not views:
                gw.metrics.rejections.labels(agent.name, "overloaded").inc()
                raise Overloaded(f"no worker serving {', '.join(models)} has room for this embedding now; retry",
                                 code="overloaded")  # fmt: skip
        last: WorkerError | None = None
        for view in views[: gw.config.gateway.max_attempts]:
            backend = gw.config.backend(view.name)
            assert backend is not None
            headers = {"content-type": "application/json", "accept-encoding": "identity"}
            if backend.api_key is not None:
                headers["authorization"] = "Bearer " + backend.api_key
            body = json.dumps({**payload, "model": backend.model}, separators=(",", ":")).encode()
            try:
                answer, status = await self._call(gw, backend, body, headers, tokens if gpu_work else None)
            except WorkerError as exc:
                last = exc
                continue
            if status >= 400:
                answer = json.dumps(worker_error_envelope(status, answer)).encode()
            return Response(answer, status, headers={"x-chimera-backend": backend.name}, media_type="application/json")
        assert last is not None
        raise client_error(last)

    async def _call(self, gw: Gateway, backend: BackendConfig, body: bytes, headers: dict[str, str],
                    held: int | None) -> tuple[bytes, int]:  # fmt: skip
        """The worker's answer and status; ``held`` tokens reserved on it meanwhile (None: no load held)."""
        reservation = await gw.state.reserve(backend.name, held) if held is not None else None
        try:
            opened = await gw.workers.open(backend, self.path, body, headers, stream=False)
            try:
                answer = await opened.read_rest(cut_at=MAX_ERROR_BODY if opened.status_code >= 400 else None)
                return answer, opened.status_code
            finally:
                await opened.aclose()
        finally:
            if reservation is not None:
                await gw.release(reservation)
