"""A cheap look at a worker's SSE stream while it is forwarded.

:class:`SSECutter` forwards whole events only (it holds back an incomplete tail until its end
arrives), so a stream that breaks mid-way, or ends without ``data: [DONE]``, can be closed with a
clean error event instead of leaving half an event for the client's parser or passing for whole.
On the way it counts ``data:`` events and keeps the ``usage`` of the last event that reports one;
it parses JSON only for events that mention ``"usage"`` with a value, i.e. usually once per stream.

A Responses API stream (``responses=True``) is typed events (``event: response.output_text.delta``) that end
with ``response.completed`` (or ``.incomplete`` / ``.failed``) instead of ``data: [DONE]``, and reports its
usage inside that last event's ``response``; its content events are the deltas.
"""

from __future__ import annotations

import json
import re
from typing import Any

_BOUNDARIES = (b"\n\n", b"\r\n\r\n")
_DONE = re.compile(rb"(?:^|\n)data: ?\[DONE\]\r?(?:\n|$)")  # the end of a stream: a line of its own, not a mention
# a Responses stream's last event, and its content events, by their `event:` line or their data's "type"
_FINAL = re.compile(rb'(?:^|\n)(?:event: ?|data: ?\{"type": ?")response\.(?:completed|incomplete|failed)\b')
_DELTA = re.compile(rb'(?:^|\n)event: ?response\.(?:output_text|function_call_arguments|refusal)\.delta\b')
_USAGE = b'"usage"'
_NULL_USAGE = re.compile(rb'"usage"\s*:\s*null')


class EventTooLarge(ValueError):
    """An event grew past the cutter's ``max_event`` bytes without its blank line."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an SSE event larger than {limit} bytes")
        self.limit = limit


class SSECutter:
    def __init__(self, *, responses: bool = False, max_event: int | None = None) -> None:
        self.responses = responses
        self.max_event = max_event  # the most an incomplete event may hold (EventTooLarge past it)
        self.deltas = 0  # a Responses stream's content events
        self._pending = bytearray()  # the start of an event whose blank line has not come yet
        self.events = 0  # data events, [DONE] included
        self.done = False  # saw data: [DONE]
        self.usage: dict[str, Any] | None = None
        self.dropped = 0  # bytes of an unterminated last event that finish() dropped

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` (with what was held back) that end at an event boundary."""
        held = len(self._pending)
        if held:  # (grown in place: a long event costs its length once, not once per chunk)
            self._pending += chunk
            data: bytes | bytearray = self._pending
        else:
            data = chunk
        start = max(0, held - 3)  # what was held has no boundary: look where one may end, in the new bytes
        cut = max(data.rfind(b, start) + len(b) if data.rfind(b, start) >= 0 else 0 for b in _BOUNDARIES)
        out = bytes(data[:cut])
        if held:
            del self._pending[:cut]
        elif cut < len(chunk):
            self._pending = bytearray(chunk[cut:])
        if self.max_event is not None and len(self._pending) > self.max_event:
            raise EventTooLarge(self.max_event)
        if out:
            self._observe(out)
        return out

    def finish(self) -> bytes:
        """What to send when the worker's stream has ended: an unterminated ``data: [DONE]`` completed with its
        blank line; any other unterminated tail dropped (an SSE parser discards an event cut off before its
        blank line, and half an event is no answer). The stream is whole only if :attr:`done` after this."""
        tail, self._pending = bytes(self._pending), bytearray()
        if tail.strip() == b"data: [DONE]":
            out = tail.rstrip() + b"\n\n"
            self._observe(out)
            return out
        self.dropped = len(tail.strip())
        return b""

    def content_events(self, *, opening_event: bool) -> int:
        """Data events but [DONE] and (``opening_event``: a chat stream's role-only first event);
        about one per generated token, for a worker that reported no usage."""
        if self.responses:
            return self.deltas
        return max(0, self.events - int(self.done) - int(opening_event))

    def _observe(self, part: bytes) -> None:
        # `part` starts at an event boundary, so a line-start "data:" is either at 0 or after "\n"
        # (a newline inside a JSON string is escaped, so it cannot fake one).
        self.events += part.startswith(b"data:") + part.count(b"\ndata:")
        if self.responses:
            self.deltas += len(_DELTA.findall(part))
            if b"response." in part and _FINAL.search(part):
                self.done = True
        elif b"[DONE]" in part and _DONE.search(part):
            self.done = True
        if _USAGE in part and len(_NULL_USAGE.findall(part)) < part.count(_USAGE):
            self._parse_usage(part)

    def _parse_usage(self, part: bytes) -> None:
        for line in part.splitlines():
            if not line.startswith(b"data:") or _USAGE not in line:
                continue
            try:
                event = json.loads(line[5:])
            except ValueError:
                continue
            usage = event.get("usage") if isinstance(event, dict) else None
            if usage is None and isinstance(event, dict) and isinstance(event.get("response"), dict):
                usage = event["response"].get("usage")  # a Responses stream's final event
            if isinstance(usage, dict):
                self.usage = usage
