"""Log lines written off the event loop, in batches (``chimera serve``).

The gateway logs one audit line per completion request (``router.audit``). Written where it is
logged, each line would be a blocking write on the event loop; handed to a thread one by one
(``logging.handlers.QueueListener``), each costs a thread wake-up instead, which measured ~9 % of a
proxied request's CPU on the gateway's core (docs/benchmarks.md, "Gateway overhead"). Here the loop
only appends the record to a deque; a thread wakes every ``interval_s``, takes what has gathered
and passes it to the original handlers, a plain stream or file handler getting the batch's lines
in one write. A line reaches its destination at most ``interval_s`` (50 ms) late; what is still
queued is written when :meth:`BatchedLogQueue.stop` is called.
"""

from __future__ import annotations

import collections
import logging
import logging.handlers
import threading
from collections.abc import Sequence

INTERVAL_S = 0.05
_FIXED = frozenset({str, int, float, bool, type(None)})  # argument types that cannot change after the call


class _Enqueue(logging.handlers.QueueHandler):
    """The root logger's one handler while the queue runs: ``prepare`` as the stdlib's (the message
    formatted now, so later changes to its arguments cannot alter it), then a deque append."""

    def __init__(self, pending: collections.deque[logging.LogRecord]) -> None:
        super().__init__(pending)  # type: ignore[arg-type]  # only enqueue() below touches it
        self._pending = pending

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # A record whose arguments cannot change (an audit line's one string) is passed as it is and
        # formatted by the thread; any other is fixed now, as the stdlib's QueueHandler does.
        args = record.args
        if (
            type(record.msg) is str
            and record.exc_info is None
            and (not args or (type(args) is tuple and all(type(a) in _FIXED for a in args)))
        ):
            return record
        prepared: logging.LogRecord = super().prepare(record)
        return prepared

    def enqueue(self, record: logging.LogRecord) -> None:
        self._pending.append(record)  # thread-safe, and wakes nobody


class BatchedLogQueue:
    """Route the root logger's records through a deque to ``handlers``, written by a thread in
    batches. Use as a context manager, or :meth:`start` and :meth:`stop`."""

    def __init__(self, handlers: Sequence[logging.Handler], interval_s: float = INTERVAL_S) -> None:
        self.handlers = tuple(handlers)
        self.interval_s = interval_s
        self._pending: collections.deque[logging.LogRecord] = collections.deque()
        self.handler: logging.Handler = _Enqueue(self._pending)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chimera-log", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Write what is queued and end the thread."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.drain()

    def __enter__(self) -> BatchedLogQueue:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            self.drain()

    def drain(self) -> None:
        """Hand every queued record to the handlers (the thread does this every ``interval_s``)."""
        batch: list[logging.LogRecord] = []
        try:
            while True:
                batch.append(self._pending.popleft())
        except IndexError:
            pass
        if batch:
            for h in self.handlers:
                _write(h, [r for r in batch if r.levelno >= h.level])


def _write(handler: logging.Handler, records: list[logging.LogRecord]) -> None:
    """``records`` through ``handler``: a plain stream or file handler (whose ``emit`` would write
    and flush once per record) gets them formatted and written at once; any other, one by one."""
    if not records:
        return
    stream = getattr(handler, "stream", None)
    if type(handler) not in (logging.StreamHandler, logging.FileHandler) or stream is None:
        for r in records:
            handler.handle(r)
        return
    assert isinstance(handler, logging.StreamHandler)
    lines: list[tuple[str, logging.LogRecord]] = []
    for r in records:  # one bad record (a format that does not fit its arguments) costs only itself
        try:
            kept = handler.filter(r)  # Python 3.12+: may be a replacement record
            if kept:
                r = kept if isinstance(kept, logging.LogRecord) else r
                lines.append((handler.format(r) + handler.terminator, r))
        except Exception:
            handler.handleError(r)
    if not lines:
        return
    assert handler.lock is not None  # made by Handler.__init__
    with handler.lock:
        try:
            stream.write("".join(line for line, _ in lines))  # encoded whole before any byte is written
        except Exception:  # e.g. a line the stream cannot encode: one by one, so that it costs only itself
            for line, r in lines:
                try:
                    stream.write(line)
                except Exception:
                    handler.handleError(r)
        stream.flush()
