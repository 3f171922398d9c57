"""Request context as a plain ASGI middleware (so streamed bodies pass through untouched).

Gives every HTTP request an id (the caller's ``X-Request-Id`` where it is sane, else a fresh one)
echoed in the response; on the completion routes it also opens the request's
:class:`RequestRecord` and, when the request is over however it ended, hands it to
:meth:`Gateway.finish` — so metrics and the request log see every request exactly once.
"""

from __future__ import annotations

import os
import re
import secrets

from router.core.asgi import ASGIApp, Message, Receive, Scope, Send, route_path
from router.core.paths import COMPLETION_PATHS
from router.gateway import gateway_in
from router.requestlog import RequestRecord

RECORD_KEY = "record"
REQUEST_ID_KEY = "request_id"
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class RequestIds:
    """Fresh request ids: 32 hex digits (as ``uuid4().hex``) from the OS's CSPRNG, drawn 256 ids'
    worth at a time. The ids must stay unguessable (``/v1/feedback`` trusts the id it is given), so
    they are never derived from a seeded generator; batching only spares a ``getrandom`` call per
    request (~2 % of a proxied request's CPU where system calls are dear)."""

    _BATCH = 16 * 256

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0
        os.register_at_fork(after_in_child=self._forget)  # a forked child must not hand out its parent's ids

    def _forget(self) -> None:
        self._pool, self._at = b"", 0

    def next(self) -> str:
        if self._at >= len(self._pool):
            self._pool, self._at = secrets.token_bytes(self._BATCH), 0
        at, self._at = self._at, self._at + 16
        return self._pool[at : at + 16].hex()


def _incoming_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            rid = value.decode("latin-1")
            return rid if _SANE_ID.match(rid) else None
    return None


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.ids = RequestIds()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _incoming_id(scope) or self.ids.next()
        state = scope.setdefault("state", {})
        state[REQUEST_ID_KEY] = rid
        endpoint = COMPLETION_PATHS.get(route_path(scope)) if scope["method"] == "POST" else None
        record = RequestRecord(request_id=rid, endpoint=endpoint) if endpoint else None
        if record is not None:
            state[RECORD_KEY] = record

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", rid.encode())]
                if record is not None and record.status is None:
                    record.status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            gw = gateway_in(state)
            if record is not None and gw is not None:
                if record.status is None:
                    record.status = 500
                if record.outcome is None:
                    status = record.status
                    record.outcome = (  # (a 5xx here is the gateway's: no healthy worker, or a bug)
                        "ok" if status < 400 else "disconnected" if status == 499
                        else "client_error" if status < 500 else "server_error"
                    )  # fmt: skip
                gw.finish(record)
