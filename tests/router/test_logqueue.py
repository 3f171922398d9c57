"""router.logqueue: records gathered on the logging side without a write or a wake-up, written by a
thread in batches, in order, at each handler's level; nothing lost at stop."""

from __future__ import annotations

import io
import logging
import time

from router.logqueue import BatchedLogQueue


class Counting(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


def _logger(name: str, handler: logging.Handler) -> logging.Logger:
    log = logging.getLogger(name)
    log.handlers, log.propagate = [handler], False
    log.setLevel(logging.DEBUG)
    return log


def test_lines_are_written_by_the_thread_in_one_write_per_batch_in_order() -> None:
    out = Counting()
    stream = logging.StreamHandler(out)
    stream.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    stream.setLevel(logging.INFO)
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    queue = BatchedLogQueue([stream, Collect()], interval_s=0.2)
    log = _logger("test.logqueue.batch", queue.handler)
    with queue:
        args = ["a"]
        for i in range(100):
            log.info("line %d %s", i, args)
        args.append("changed later")  # the message was fixed when it was logged
        log.info("fixed %s %d", "arguments", 3)  # immutable arguments: formatted by the thread
        log.debug("only for the collector")
        assert out.getvalue() == ""  # nothing written on the logging side
        deadline = time.monotonic() + 5
        while not out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert out.writes == 1  # the batch in one write
    lines = out.getvalue().splitlines()
    assert lines == [*(f"INFO line {i} ['a']" for i in range(100)), "INFO fixed arguments 3"]
    assert seen == [*(f"line {i} ['a']" for i in range(100)), "fixed arguments 3", "only for the collector"]


def test_stop_writes_what_is_still_queued() -> None:
    out = io.StringIO()
    queue = BatchedLogQueue([logging.StreamHandler(out)], interval_s=60)
    log = _logger("test.logqueue.stop", queue.handler)
    queue.start()
    log.warning("last words")
    queue.stop()
    assert out.getvalue() == "last words\n"


def test_a_bad_record_costs_only_itself() -> None:
    out = io.StringIO()
    queue = BatchedLogQueue([logging.StreamHandler(out)], interval_s=60)
    log = _logger("test.logqueue.bad", queue.handler)
    queue.start()
    log.info("%s", "first")
    log.warning("bad %d", "not a number")  # formatted by the thread, where it fails
    log.info("%s", "second")
    queue.stop()
    assert out.getvalue() == "first\nsecond\n"
