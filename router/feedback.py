"""``POST /v1/feedback``: how good an answer was, for the predictor's quality model.

Body: ``{"request_id": "<the X-Request-Id of the answer>", "score": 0..1}`` or ``{..., "correct": bool}``.
The caller is authenticated like a completion (its agent must resolve). The score is appended to the
request log as ``{"type": "feedback", ...}`` (what ``chimera predictor train`` joins on) and handed to
the gateway's predictor for its next online refit. Answers ``{"ok": true, "matched": bool}`` —
``matched``: the predictor still holds that request in its training window. A verdict on another agent's request is
404 ``request_not_found`` and kept nowhere: one tenant cannot grade another's answers (the offline trainer checks
the logged agent likewise, ``predictor/dataset.py``). An agent with an ``rpm`` may post that many verdicts a minute
(429 past it), apart from its requests.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from router.core.errors import BadRequest, RequestNotFound, shown
from router.edge import _json, request_body
from router.gateway import gateway_of
from router.ratelimit import charge_feedback

MAX_FEEDBACK_BYTES = 16 * 1024


def parse_feedback(body: Any) -> tuple[str, float]:
    if not isinstance(body, dict):
        raise BadRequest("the feedback body must be a JSON object")
    rid = body.get("request_id")
    if not isinstance(rid, str) or not rid or len(rid) > 128:
        raise BadRequest("request_id must be a non-empty string", param="request_id", code="invalid_type")
    # as the published schema (router.openapi, "Feedback") says: score and correct each of its type where
    # given, at least one of them; correct wins where both are
    correct, score = body.get("correct"), body.get("score")
    if "correct" in body and not isinstance(correct, bool):
        raise BadRequest("correct must be a boolean", param="correct", code="invalid_type")
    if "score" in body and (isinstance(score, bool) or not isinstance(score, int | float) or not 0.0 <= score <= 1.0):
        raise BadRequest("score must be a number in [0, 1]", param="score", code="invalid_type")
    if correct is not None:
        return rid, 1.0 if correct else 0.0
    if score is None:
        raise BadRequest("give score (a number in [0, 1]) or correct (a boolean)", param="score",
                         code="missing_required_parameter")  # fmt: skip
    return rid, float(score)


async def post_feedback(request: Request) -> JSONResponse:
    gw = gateway_of(request)
    agent = gw.agents.resolve(request.headers)
    await charge_feedback(gw, agent)  # each verdict is a line in the request log: not for free
    body = await request_body(request.receive, request.headers.get("content-length"), MAX_FEEDBACK_BYTES)
    rid, score = parse_feedback(_json(body))
    matched = gw.predictor.feedback(rid, score, agent.name) if gw.predictor is not None else False
    if matched is None:
        raise RequestNotFound(f"no recent request of agent {agent.name!r} has the id {shown(rid)}",
                              param="request_id")  # fmt: skip
    gw.log.write_event({"type": "feedback", "request_id": rid, "score": score, "agent": agent.name, "ts": time.time()})
    return JSONResponse({"ok": True, "matched": matched})
