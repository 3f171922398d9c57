"""Dispatch a validated completion request to a worker: routing, retries, streaming, disconnects.

:class:`ProxyResponse` is the ASGI response the completion endpoints return. When called it

1. takes a fleet snapshot, keeps the eligible workers and asks the policy for a ranking
   (none eligible: 503);
2. tries the ranked workers in turn, at most ``gateway.max_attempts`` of them: each attempt
   reserves load on the worker, sends the original body bytes, and waits for the first body byte.
   A connect error, a first-byte timeout, a 5xx or a broken answer moves on to the next worker:
   nothing has reached the client yet, so a retry is safe. A 4xx is the caller's and is passed
   through as it is. When every attempt failed the client gets 502 (or 504 for a timeout);
3. streams an SSE answer event by event as it arrives; a stream that breaks mid-way (the worker
   died, or went silent past ``between_chunks_s``) ends with an SSE error event in OpenAI's
   envelope, then the response closes;
4. watches the client (from the request's first 20 ms on): if it disconnects, the work is cancelled,
   which closes the upstream connection, so the worker aborts the request too.

Every reservation is released in a ``finally`` (disconnects included) and every worker outcome is
reported to the fleet state for passive health.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.responses import JSONResponse

from backends.client import MAX_ERROR_BODY, WorkerResponse
from router.call import ProxyCall
from router.core.asgi import Message, Receive, Scope, Send
from router.core.errors import (
    ClientError,
    NoHealthyWorker,
    Overloaded,
    UpstreamFailed,
    UpstreamTimedOut,
    WorkerError,
    WorkerProtocolError,
    WorkerTimeout,
)
from router.core.types import BackendView, Decision, FleetSnapshot, Policy, RequestFeatures
from router.features import prefill_tokens, reserved_tokens
from router.gateway import Gateway
from router.ratelimit import refund_rate_limits
from router.requestlog import RequestRecord
from router.sse import EventTooLarge, SSECutter
from router.state.base import Feedback, FleetView, LoadLedger, Reservation

log = logging.getLogger(__name__)
PASSED_HEADERS = ("content-type", "cache-control")  # worker response headers the client sees
WATCH_AFTER_S = 0.02  # how long a request runs before the client's disconnect is watched for


def choose(view: FleetView, policy: Policy, features: RequestFeatures) -> tuple[Decision, FleetSnapshot]:
    """The policy's ranking among the servable workers (:meth:`FleetSnapshot.servable`). Raises NoHealthyWorker."""
    eligible = view.snapshot().servable(features)
    return policy(features, eligible), eligible


class ProxyResponse:
    """The ASGI response of a completion request (see the module's docstring)."""

    def __init__(self, gw: Gateway, call: ProxyCall) -> None:
        self.gw = gw
        self.call = call
        self.load: LoadLedger = gw.state  # what the proxy writes to the fleet state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if await run_until_disconnect(lambda tracked: self._serve(scope, receive, tracked), receive, send):
            rec = self.call.record
            rec.outcome = "disconnected"
            rec.status = rec.status or 499

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw, call, rec = self.gw, self.call, self.call.record
        if gw.admission is not None:  # may queue, degrade the call, or raise Overloaded (429)
            try:
                decision, eligible = await gw.admission.admit(call)
            except Overloaded:
                await refund_rate_limits(gw, call.features)
                raise
        else:
            decision, eligible = choose(gw.state, gw.policy, call.features)
        rec.policy, rec.reason = gw.policy_name, decision.reason
        if decision.ranked:
            call.why = decision.ranked[0], explain(decision)
        rec.predicted = dict(decision.predicted) or None
        p = decision.predicted
        call.predicted_output = p.get("output_tokens")
        if ("ttft_model_ms" in p or "tpot_model_ms" in p) and decision.ranked and _single_choice(call.payload):
            ttft, tpot = p.get("ttft_model_ms"), p.get("tpot_model_ms")
            call.predicted_timing = (decision.ranked[0], ttft and ttft / 1e3, tpot and tpot / 1e3)
        ranked = [n for n in dict.fromkeys(decision.ranked) if eligible.by_name(n) is not None]
        if not ranked:
            raise NoHealthyWorker("the routing policy chose no worker")
        last: WorkerError | None = None
        for name in ranked[: gw.config.gateway.max_attempts]:
            rec.attempts += 1
            try:
                if await self._attempt(name, eligible.by_name(name), send):
                    return
            except WorkerError as exc:
                last = exc
                gw.metrics.worker_failed(name, type(exc).__name__)
                await self.load.record_result(name, False)
        assert last is not None
        rec.outcome, rec.error = "worker_error", type(last).__name__
        err = client_error(last)
        await JSONResponse(err.envelope(), err.status_code, headers=self._headers(last.backend))(scope, receive, send)

    async def _attempt(self, name: str, view: BackendView | None, send: Send) -> bool:
        """One worker. True when the answer was delivered; WorkerError when a retry is safe."""
        gw, call, rec = self.gw, self.call, self.call.record
        backend = gw.config.backend(name)
        assert backend is not None and view is not None
        headers = {"content-type": "application/json", "accept-encoding": "identity",
                   "x-request-id": call.request_id}  # fmt: skip
        if backend.api_key is not None:  # the worker's own key (vLLM --api-key), never the caller's
            headers["authorization"] = "Bearer " + backend.api_key
        # a streamed request's uncached prompt is the worker's prefill backlog until its first token shows
        reserved, prefill = reserved_tokens(call.features, call.predicted_output), prefill_tokens(call.features, name)
        reservation = await self.load.reserve(name, reserved, prefill)
        try:
            call.sent_at = time.perf_counter()
            priority, by_priority = None, gw.engine_priority
            if by_priority is not None and backend.scheduling_policy == "priority":  # the caller's own is replaced
                priority = by_priority(call.features, rec.predicted)
            opened = await gw.workers.open(
                backend, call.path, call.body_for(backend.model, priority), headers, stream=call.features.stream
            )
            try:
                rec.backend, rec.model = name, backend.model
                rec.fleet = _fleet_features(view)
                if gw.predictor is not None:
                    rec.fleet.update(gw.predictor.dispatched(call.features, name))
                if opened.status_code >= 400 or not call.features.stream:
                    await self._send_whole(opened, send)
                else:
                    await self._send_stream(opened, send, reservation)
            finally:
                await opened.aclose()
        finally:
            await gw.release(reservation)
        return True

    def _headers(self, backend: str, opened: WorkerResponse | None = None) -> dict[str, str]:
        h = {k: v for k in PASSED_HEADERS if opened is not None and (v := opened.headers.get(k))}
        h["x-chimera-backend"] = backend
        h["x-chimera-policy"] = self.gw.policy_name
        h["x-chimera-attempts"] = str(self.call.record.attempts)
        if self.call.degraded:
            h["x-chimera-degraded"] = self.call.degraded
        why = self.call.why
        if why is not None and why[0] == backend:  # a retry's worker was not chosen for these reasons
            h.update(why[1])
        return h

    async def _send_whole(self, opened: WorkerResponse, send: Send) -> None:
        """A non-streamed answer, or a 4xx: read it all (a failure is still retryable), then send."""
        rec = self.call.record
        body = await opened.read_rest(cut_at=MAX_ERROR_BODY if opened.status_code >= 400 else None)
        if opened.status_code < 400:
            _count_usage(rec, _usage_of(body, opened.backend))
            rec.outcome = "ok"
        else:  # the caller's mistake, as the worker words it, in the gateway's envelope
            body = json.dumps(worker_error_envelope(opened.status_code, body)).encode()
        await self.load.record_result(opened.backend, True)
        headers = [(k.encode(), v.encode()) for k, v in self._headers(opened.backend, opened).items()]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": opened.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _send_stream(self, opened: WorkerResponse, send: Send, reservation: Reservation) -> None:
        gw, rec = self.gw, self.call.record
        if not opened.content_type.startswith("text/event-stream"):
            # Nothing has reached the client yet: one more retryable failure. Passed on, the client
            # would get a "stream" that is not SSE and never ends with [DONE] or an error event.
            raise WorkerProtocolError(f"worker {opened.backend} answered a stream with {opened.content_type!r}, "
                                      "not an event stream", backend=opened.backend)  # fmt: skip
        # TTFT is taken at the first *content* event: a chat stream may open with a role-only event
        # before any token exists (the simulator sends it at once), which is not a first token.
        opening = self.call.features.endpoint == "chat"
        cutter = SSECutter(responses=self.call.features.endpoint == "responses",
                           max_event=gw.config.gateway.max_event_bytes)  # fmt: skip
        headers = [(k.encode(), v.encode()) for k, v in self._headers(opened.backend, opened).items()]
        await send({"type": "http.response.start", "status": opened.status_code, "headers": headers})
        try:
            chunk: bytes | None = opened.first_chunk
            while chunk is not None:
                out = _fed(cutter, chunk, opened.backend)
                if opened.ended:  # the worker's answer is all here: send it with the end of ours, one write
                    out += cutter.finish()
                    if cutter.done:
                        await send({"type": "http.response.body", "body": out, "more_body": False})
                        break
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    raise _unfinished(opened.backend, cutter)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    if rec.ttft_s is None and cutter.content_events(opening_event=opening):
                        rec.ttft_s = time.perf_counter() - rec.started
                        self.load.first_token(reservation)
                chunk = await opened.next_chunk()
            else:
                out = cutter.finish()
                if not cutter.done:
                    raise _unfinished(opened.backend, cutter)
                await send({"type": "http.response.body", "body": out, "more_body": False})
        except WorkerError as exc:
            # Too late to retry: the client has part of the answer. Close with an error event.
            rec.outcome, rec.error = "worker_error", type(exc).__name__
            gw.metrics.worker_failed(opened.backend, type(exc).__name__)
            await self.load.record_result(opened.backend, False)
            event = b"data: " + json.dumps(client_error(exc).envelope()).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": False})
            return
        rec.e2e_s = time.perf_counter() - rec.started
        if rec.ttft_s is None and cutter.content_events(opening_event=opening):
            rec.ttft_s = rec.e2e_s  # the first content came with the end of the answer
        _count_usage(rec, cutter.usage or {})
        if rec.completion_tokens is None:
            rec.completion_tokens = cutter.content_events(opening_event=opening)
        rec.outcome = "ok"
        await self.load.record_result(opened.backend, True, ttft_s=rec.ttft_s, tpot_s=rec.tpot_s,
                                     feedback=self._feedback(opened.backend))  # fmt: skip

    def _feedback(self, backend: str) -> Feedback | None:
        """The streamed answer's timings beside the policy's predictions, where it predicted them for
        ``backend``. TTFT is the worker's own (not the gateway's time before sending, nor an admission
        queue's), and only where the first token came before the end (an answer read in one piece has
        no TTFT of its own). None for a worker that learns its own step times (its answers refit them, so a ratio
        against the terms it had at dispatch would correct what is already corrected: router.learning)."""
        call, rec = self.call, self.call.record
        timing = call.predicted_timing
        if timing is None or timing[0] != backend:
            return None
        if self.gw.predictor is not None and backend in self.gw.predictor.unprofiled:
            return None
        first = rec.ttft_s if rec.ttft_s is not None and rec.e2e_s is not None and rec.ttft_s < rec.e2e_s else None
        ttft = None if first is None else first - (call.sent_at - rec.started)
        return Feedback(ttft, timing[1], rec.tpot_s, timing[2])


def explain(decision: Decision) -> dict[str, str]:
    """Why the policy ranked its first choice first, as response headers a person can read (docs/http-api.md):
    the policy's reason, the runner-up and, where the policy predicted them, the first choice's e2e and chance of
    a good answer beside the runner-up's, and how much dearer the runner-up's expected cost was."""
    why = {"x-chimera-reason": decision.reason}
    if len(decision.ranked) > 1:
        why["x-chimera-runner-up"] = decision.ranked[1]
    p = decision.predicted
    for key, header, fmt in _EXPLAINED:
        if (value := p.get(key)) is not None:
            why[header] = fmt.format(value)
    return why


_EXPLAINED = (  # Decision.predicted's keys shown in the answer's headers
    ("e2e_ms", "x-chimera-predicted-e2e-ms", "{:.0f}"),
    ("quality", "x-chimera-predicted-quality", "{:.2f}"),
    ("runner_up_e2e_ms", "x-chimera-runner-up-e2e-ms", "{:.0f}"),
    ("runner_up_quality", "x-chimera-runner-up-quality", "{:.2f}"),
    ("cost_gap", "x-chimera-runner-up-dearer", "{:+.1%}"),
)


def _fed(cutter: SSECutter, chunk: bytes, backend: str) -> bytes:
    try:
        return cutter.feed(chunk)
    except EventTooLarge as exc:
        raise WorkerProtocolError(f"worker {backend} sent a stream event larger than {exc.limit} bytes "
                                  "(gateway.max_event_bytes)", backend=backend) from None  # fmt: skip


def _unfinished(backend: str, cutter: SSECutter) -> WorkerProtocolError:
    """A stream that ended without ``data: [DONE]`` (vLLM and OpenAI end every stream with it): cut short, not
    whole, even where the connection closed cleanly."""
    cut = f" in the middle of an event ({cutter.dropped} bytes dropped)" if cutter.dropped else ""
    return WorkerProtocolError(f"worker {backend} ended the stream{cut} without data: [DONE]", backend=backend)


async def run_until_disconnect(
    work: Callable[[Send], Coroutine[Any, Any, None]],
    receive: Receive,
    send: Send,
    *,
    watch_after_s: float = WATCH_AFTER_S,
) -> bool:
    """Run ``work(send)`` in this task; from ``watch_after_s`` on, a watcher task waits for the
    client's disconnect and cancels this one on it (as ``asyncio.timeout`` cancels). True when the
    client went away before the response was complete. Errors of ``work`` propagate.

    Most answers that cost the gateway anything are over before ``watch_after_s``: they never
    start a watcher (a task per request, and its wake-up when uvicorn reports the end of the
    response, ~2 % of a short request's CPU). A client gone earlier is seen as soon as the watcher
    starts: uvicorn answers ``http.disconnect`` at once then."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    complete = disconnected = False
    watcher: asyncio.Task[None] | None = None

    async def tracked_send(message: Message) -> None:
        nonlocal complete
        await send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            complete = True

    async def watch() -> None:
        nonlocal disconnected
        while (await receive())["type"] != "http.disconnect":
            pass
        if not complete:  # uvicorn reports a finished response as a disconnect: only bookkeeping is left
            disconnected = True
            task.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    timer = loop.call_later(watch_after_s, start_watching)
    try:
        await work(tracked_send)
    except asyncio.CancelledError:
        if not disconnected or task.uncancel() > 0:  # cancelled by someone else too: let it through
            raise
        return True
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
    return False


def client_error(exc: WorkerError) -> ClientError:
    """What the caller is told of a worker's failure: the worker, and what went wrong in the gateway's words: never a
    transport's text, which names hosts and ports (the operator's log has it), nor a worker's own 5xx message, which
    may name internals or echo the prompt (so it goes to no log either)."""
    log.warning("%s", exc)
    if isinstance(exc, WorkerTimeout):
        return UpstreamTimedOut(exc.public)
    return UpstreamFailed(exc.public)


#: The gateway's error type and code for a worker's own 4xx (OpenAI's names), where the worker gave no string code.
_WORKER_4XX = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "invalid_request"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


def worker_error_envelope(status: int, body: bytes) -> dict[str, dict[str, str | None]]:
    """A worker's 4xx answer in OpenAI's envelope with the gateway's types and string codes: vLLM writes its own
    (``"type": "BadRequestError"``, ``"code": 400``); the worker's message and ``param`` are kept."""
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        err = None
    err = err if isinstance(err, dict) else {}
    kind, code = _WORKER_4XX.get(status, ("invalid_request_error", "worker_error"))
    param, own = err.get("param"), err.get("code")
    return {"error": {"message": _worker_message(body), "type": kind,
                      "param": param if isinstance(param, str) else None,
                      "code": own if isinstance(own, str) and own else code}}  # fmt: skip


def _worker_message(body: bytes) -> str:
    try:
        err = json.loads(body).get("error")
        msg = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        msg = None
    text = msg if isinstance(msg, str) else body.decode("utf-8", "replace")
    return text[:300] or "(no body)"


def _count_usage(rec: RequestRecord, usage: dict[str, Any]) -> None:
    """The answer's token counts from its ``usage``: chat's and completions' names, or the Responses API's."""
    prompt = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
    if prompt:
        rec.prompt_tokens, rec.prompt_tokens_exact = prompt, True
    rec.completion_tokens = _int(usage.get("completion_tokens", usage.get("output_tokens")))
    rec.completion_tokens_exact = rec.completion_tokens is not None


def _usage_of(body: bytes, backend: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise WorkerProtocolError(f"worker {backend} answered a body that is not JSON", backend=backend) from exc
    usage = data.get("usage") if isinstance(data, dict) else None
    return usage if isinstance(usage, dict) else {}


def _single_choice(payload: dict[str, Any]) -> bool:
    """One answer per request (no ``n`` > 1, no ``best_of``): several share a stream's tokens, so its
    decode time per token is no worker's."""
    return (payload.get("n") or 1) == 1 and not payload.get("best_of")


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _fleet_features(v: BackendView) -> dict[str, Any]:
    return {
        "inflight_requests": v.inflight_requests,
        "inflight_tokens": v.inflight_tokens,
        "pending_prefill_tokens": v.pending_prefill_tokens,
        "running": v.running,
        "waiting": v.waiting,
        "kv_usage": v.kv_usage,
        "metrics_age_s": v.metrics_age_s,
        "kv_budget_tokens": v.kv_budget_tokens,
        "ttft_ewma_s": v.ttft_ewma_s,
        "tpot_ewma_s": v.tpot_ewma_s,
        "ttft_bias": v.ttft_bias,
        "tpot_bias": v.tpot_bias,
    }
