"""The audit trail: one log line per finished completion request on the ``chimera.audit`` logger.

The line is a JSON object (so a value a caller chose, such as a model name, cannot break it into
two lines or forge a field): request id, agent, model, worker, HTTP status, attempts and the
end-to-end time in ms. It never holds prompt text, answer text or a key: it is built from the
:class:`RequestRecord`, which holds none of them. Routed to wherever the operator's logging config
sends ``chimera.audit`` (``chimera serve`` logs INFO to stderr); skipped at no cost when that
logger is off.
"""

from __future__ import annotations

import json
import logging

from router.requestlog import RequestRecord

log = logging.getLogger("chimera.audit")

MAX_MODEL_CHARS = 128  # a requested model name is the caller's text: keep the line bounded


def audit_line(record: RequestRecord) -> str:
    model = record.model or (record.requested_model or "")[:MAX_MODEL_CHARS] or None
    e2e_ms = None if record.e2e_s is None else round(record.e2e_s * 1000.0, 1)
    fields = {
        "request_id": record.request_id,
        "agent": record.agent,
        "model": model,
        "backend": record.backend,
        "status": record.status,
        "attempts": record.attempts,
        "e2e_ms": e2e_ms,
        "outcome": record.outcome,
    }
    return json.dumps(fields, separators=(",", ":"))  # ensure_ascii: one line, any input


def audit(record: RequestRecord) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info("%s", audit_line(record))
