"""The per-request record and the JSON-lines request log the predictor trains on.

A :class:`RequestRecord` is filled in while a request is served (edge, then proxy) and finished
once by the request-context middleware. :class:`RequestLog` appends one JSON line per finished
request to ``gateway.request_log``: lines are buffered in memory and written by a background task
through a worker thread, so the event loop never waits on the disk. A line is serialised with
orjson (a tenth of the stdlib's time; non-ASCII text as UTF-8, not escaped). Prompt text and API keys
are never part of a record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any

import orjson

from router.core.errors import ChimeraError
from router.promptlen import PromptCounts

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.5
FLUSH_LINES = 512  # flush early when this many lines are waiting


@dataclass(slots=True)
class RequestRecord:
    """One request as the gateway saw it (timings in seconds; ``None``: unknown or not applicable)."""

    request_id: str
    endpoint: str
    ts: float = field(default_factory=time.time)  # wall clock at arrival
    started: float = field(default_factory=time.perf_counter)
    agent: str | None = None
    requested_model: str | None = None
    model: str | None = None  # the served model of the worker that answered
    backend: str | None = None
    policy: str | None = None
    reason: str | None = None
    stream: bool | None = None
    prompt_tokens: int | None = None  # the worker's usage where it reported it, else the estimate
    prompt_tokens_est: int | None = None  # the gateway's estimate (router.promptlen), calibrated per model
    prompt_tokens_exact: bool = False  # prompt_tokens from the worker's usage (True) or the estimate (False)
    completion_tokens: int | None = None
    completion_tokens_exact: bool = False  # from usage (True) or counted from SSE events (False)
    max_tokens: int | None = None
    message_count: int | None = None
    priority: int | None = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2e_ms: float | None = None
    ttft_s: float | None = None  # streams only: when the first chunk reached the gateway
    e2e_s: float | None = None
    status: int | None = None  # the HTTP status sent (a stream broken mid-way still says 200)
    outcome: str | None = None  # ok | client_error | worker_error | server_error | disconnected
    attempts: int = 0
    error: str | None = None  # the error's class name, e.g. WorkerTimeout, BadRequest
    fleet: dict[str, Any] | None = None  # the chosen worker's load at dispatch
    predicted: dict[str, float] | None = None
    workflow_id: str | None = None  # x-workflow-id / x-workflow-stage (predictor: remaining workflow output)
    workflow_stage: int | None = None
    sketch: list[float] | None = None  # the prompt's hashed sketch (predictor.sketch; never the text itself)
    queue_wait_s: float | None = None  # time held by admission control (router.admission) before dispatch
    degraded: str | None = None  # what admission control degraded, e.g. "max_tokens=256" (X-Chimera-Degraded)
    prompt: PromptCounts | None = None  # the prompt's make-up, for the estimate's calibration (not logged)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return max(0.0, self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        """The logged fields (all but ``started`` and ``prompt``) and ``tpot_s``; containers copied, not shared."""
        # Not dataclasses.asdict: its recursive deep copy cost ~40 us per request.
        out = {name: getattr(self, name) for name in _LOGGED}
        for name in ("fleet", "predicted"):
            if out[name] is not None:
                out[name] = dict(out[name])
        if self.sketch is not None:
            out["sketch"] = list(self.sketch)
        out["tpot_s"] = self.tpot_s
        return out


_LOGGED = tuple(f.name for f in fields(RequestRecord) if f.name not in ("started", "prompt"))


class RequestLog:
    """Appends records as JSON lines to ``path`` (``None``: logging off, ``write`` is a no-op)."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self._buf: list[bytes] = []
        self._wake = asyncio.Event()
        self._file: IO[bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    async def start(self) -> None:
        if self.path is None or self._task is not None:
            return
        self._file = await asyncio.to_thread(_open_append, self.path)
        self._task = asyncio.create_task(self._run(), name="request-log")

    def write(self, record: RequestRecord) -> None:
        if self._file is None:
            return
        self._buf.append(_line(record.to_json()))
        if len(self._buf) >= FLUSH_LINES:
            self._wake.set()

    def write_event(self, event: dict[str, Any]) -> None:
        """Append a line that is not a request record (e.g. ``{"type": "feedback", ...}``)."""
        if self._file is None:
            return
        self._buf.append(_line(event))

    async def flush(self) -> None:
        lines, self._buf = self._buf, []
        if lines and self._file is not None:
            await asyncio.to_thread(_write, self._file, lines)

    async def close(self) -> None:
        if self._task is not None:
            self._closing = True  # the task writes what is left and returns (never cut mid-write)
            self._wake.set()
            await self._task
            self._task = None
        await self.flush()
        if self._file is not None:
            await asyncio.to_thread(self._file.close)
            self._file = None

    async def _run(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLUSH_INTERVAL_S):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
            except OSError as exc:  # a full disk must not take the gateway down; say so and go on
                log.warning("request log %s: %s", self.path, exc)


def _line(obj: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # what orjson refuses (say an integer beyond 64 bits in a worker's usage)
        return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _open_append(path: Path) -> IO[bytes]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("ab")
    except OSError as exc:
        raise ChimeraError(f"cannot open the request log {str(path)!r}: {exc.strerror or exc}") from None


def check_writable(path: str | None) -> None:
    """Open the request log ``path`` for appending (making its directory) and close it again: a start-up check
    that fails with one line (:class:`ChimeraError`) before anything else starts."""
    if path is not None:
        _open_append(Path(path)).close()


def _write(file: IO[bytes], lines: list[bytes]) -> None:
    file.writelines(lines)
    file.flush()
