"""The OpenAI-compatible endpoints: who is calling, is the request sound, where may it go.

Checks run in the order a caller can act on: the agent (401), the body's size (413), its JSON and
fields (400), the model (404 unknown, 403 not allowed). The body's bytes are then handed to the
proxy unchanged.

The completion endpoints are plain ASGI apps (:class:`Completion`), the hot path: no Starlette
Request or Response objects. Their ClientErrors still leave through the app's exception handler.
"""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from router.call import ProxyCall
from router.core.asgi import ASGIApp, Message, Receive, Scope, Send, header_map, read_body, route_path
from router.core.config import AUTO_MODEL
from router.core.errors import BadRequest, ClientError, ModelNotFound, shown
from router.core.paths import UPSTREAM_PATHS
from router.core.types import Endpoint
from router.features import build_features, parse_body, resolve_models
from router.gateway import STATE_KEY, Gateway, gateway_of
from router.middleware import RECORD_KEY, REQUEST_ID_KEY
from router.proxy import ProxyResponse
from router.ratelimit import REFUSED, charge_refused, enforce_rate_limits
from router.requestlog import RequestRecord

_CREATED = int(time.time())
MAX_LOGGED_MODEL = 256  # the most of a requested model name the request log keeps (a caller may send 1 MB)


async def request_body(receive: Receive, content_length: str | None, limit: int) -> bytes:
    """The request body; BodyTooLarge as soon as it is known to exceed ``limit`` bytes, ClientDisconnect
    if the caller hangs up before sending all of it."""
    body = await read_body(receive, limit, content_length=content_length)
    if body is None:
        raise ClientDisconnect()
    return body


def _json(body: bytes) -> Any:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if _may_hold_surrogates(body) and _has_lone_surrogate(payload):
        raise BadRequest("the request body is not valid JSON: it holds a lone UTF-16 surrogate, which is not text",
                         code="invalid_json")  # fmt: skip
    return payload


# json.loads lets a lone surrogate through (an escape "\ud800", or its raw bytes, which it decodes
# with "surrogatepass") as a str that cannot be encoded: nothing downstream (a tokenizer, the
# predictor's sketch, a log) can use it, so it is refused here, like invalid UTF-8.
def _may_hold_surrogates(body: bytes) -> bool:
    """A cheap pre-check (byte searches, about a millisecond a megabyte at worst): an escape in U+D000..U+DFFF, a
    UTF-8 lead byte of that range, or a body that is not UTF-8 at all (UTF-16 or -32, by its first bytes)."""
    if body[:1] == b"\x00" or body[1:2] == b"\x00" or body[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\xed" in body:
        return True
    return b"\\" in body and (b"\\ud" in body or b"\\uD" in body)  # (one byte first: far the quicker search)


def _has_lone_surrogate(payload: Any) -> bool:
    stack = [payload]  # iterative: a payload nested as deep as json.loads allows must not recurse
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode()
                except UnicodeEncodeError:
                    return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


class Completion:
    """POST /v1/chat/completions (``endpoint="chat"``) and /v1/completions, as an ASGI app."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope["state"]
        gw: Gateway = state[STATE_KEY]
        call = await self.validate(gw, scope, receive, state[RECORD_KEY], state[REQUEST_ID_KEY])
        await ProxyResponse(gw, call)(scope, receive, send)

    async def validate(self, gw: Gateway, scope: Scope, receive: Receive, record: RequestRecord,
                       request_id: str) -> ProxyCall:  # fmt: skip
        """The request as the proxy takes it, its record filled in. Raises ClientError."""
        endpoint = self.endpoint
        headers = header_map(scope)
        named = gw.agents.named(headers)  # a bad key is 401 before the body is read
        if named is not None:
            record.agent = named.name
        body = await request_body(receive, headers.get("content-length"), gw.config.gateway.max_body_bytes)
        try:
            payload = _json(body)
            parsed = parse_body(endpoint, payload)
            agent = gw.agents.settle(named, parsed.model)
            record.agent = agent.name
            record.requested_model, record.stream = parsed.model[:MAX_LOGGED_MODEL], parsed.stream
            models = resolve_models(gw.config, agent, parsed.model)
        except REFUSED:
            await charge_refused(gw, gw.config.agent(record.agent) if record.agent else None, record)
            raise
        prompt_tokens = gw.prompt_lengths.estimate(parsed.prompt, models)
        features = build_features(endpoint, agent, models, parsed, headers, gw.next_seq(), prompt_tokens)
        record.prompt = parsed.prompt
        if gw.predictor is not None:  # the prompt's sketch and prefix affinity, computed once here
            features = gw.predictor.enrich(features, endpoint, payload, record)
        await enforce_rate_limits(gw, agent, features, record)
        record.prompt_tokens = record.prompt_tokens_est = features.prompt_tokens
        record.max_tokens, record.message_count, record.priority = (
            features.max_tokens, features.message_count, features.priority,
        )  # fmt: skip
        record.workflow_id, record.workflow_stage = features.workflow_id, features.workflow_stage
        record.slo_ttft_ms, record.slo_tpot_ms, record.slo_e2e_ms = (
            features.ttft_slo_ms, features.tpot_slo_ms, features.e2e_slo_ms,
        )  # fmt: skip
        return ProxyCall(UPSTREAM_PATHS[endpoint], body, payload, features, request_id, record)


class CompletionLane:
    """ASGI middleware (inside :class:`router.middleware.RequestContextMiddleware`): a POST to a
    completion path goes straight to its :class:`Completion`, past Starlette's exception middleware,
    router and route wrapper (three layers per call and per ``send`` on the gateway's busiest path);
    anything else goes on to the app. Errors are answered as the app's handlers answer them: a
    ClientError with its envelope, a client gone while sending its body with 499; any other error
    propagates to the server-error middleware outside (500)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.lanes = {path: Completion(endpoint) for endpoint, path in UPSTREAM_PATHS.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = self.lanes.get(route_path(scope)) if scope["type"] == "http" and scope["method"] == "POST" else None
        if lane is None:
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await lane(scope, receive, tracked)
        except (ClientError, ClientDisconnect) as exc:
            if started:
                raise RuntimeError("Caught handled exception, but response already started.") from exc
            response = client_error_response(exc) if isinstance(exc, ClientError) else Response(status_code=499)
            await response(scope, receive, send)


def client_error_response(exc: ClientError) -> JSONResponse:
    """The answer to a ClientError: OpenAI's error envelope, its status and headers."""
    return JSONResponse(exc.envelope(), exc.status_code, headers=exc.headers())


async def list_models(request: Request) -> JSONResponse:
    """GET /v1/models: ``auto`` first (a client that takes the first model, as guidellm does, is then routed),
    then the models the caller's agent may use."""
    agent = gateway_of(request).agents.resolve(request.headers)
    return JSONResponse({"object": "list", "data": [_model_card(m) for m in (AUTO_MODEL, *agent.models)]})


async def get_model(request: Request) -> JSONResponse:
    """GET /v1/models/{model} (the SDK's ``models.retrieve``): one of those, else 404 as OpenAI answers it."""
    agent = gateway_of(request).agents.resolve(request.headers)
    model = request.path_params["model"]
    if model not in (*agent.models, AUTO_MODEL):
        raise ModelNotFound(f"The model {shown(model)} does not exist", param="model")
    return JSONResponse(_model_card(model))


def _model_card(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": _CREATED, "owned_by": "chimera"}
