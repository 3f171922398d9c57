"""Running a ``/v1/responses`` request, and its event stream as vLLM 0.26 writes it (``responses/serving.py``,
``SimpleStreamingEventProcessor`` in ``responses/streaming_events.py``).

``response.created`` and ``response.in_progress`` (the response object, ``in_progress``, no output), then per
output item: a message opens with ``response.output_item.added`` and ``response.content_part.added`` and takes
one ``response.output_text.delta`` a token; a function call opens with ``response.output_item.added`` (its
name, empty arguments) and takes ``response.function_call_arguments.delta`` events. An item closes (its
``….done`` events) when the next opens or the answer ends; ``response.completed`` carries the final object.
Events are ``event: TYPE`` / ``data: JSON`` SSE records, numbered by ``sequence_number`` from 0. As in vLLM,
the streamed items' ids (a bare hex id, ``call_…``) are not those of the final object (``msg_…``, ``fc_…``,
``chatcmpl-tool-…``): the final one is built afresh from the whole answer.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from backends.sim import api
from backends.sim.api import JSON_HEADERS, SPACED_WORDS, SSE_HEADERS, WORDS
from backends.sim.drive import finished, running
from backends.sim.engine import Engine, Request, Status
from backends.sim.responses import MakeRequest, ResponsesCall, final, response_object
from backends.sim.script import Script, draw_script
from router.core.asgi import Receive, Send, respond


async def complete(engine: Engine, model: str, seed: int, call: ResponsesCall, make: MakeRequest,
                   receive: Receive, send: Send) -> None:  # fmt: skip
    """Run the request through the engine and answer it: the response object, or its event stream."""
    c = call.completion
    key = api.answer_key(c, c.prompt_text)
    s = c.structure
    script = draw_script(s, seed, model, key) if s is not None and s.scripted else None
    req = make(call.response_id, key, c.prompt_ids, None if script is None else len(script.pieces))
    created = int(time.time())
    async with running(engine, [req], receive, c.stream):
        if c.stream:
            await _stream(call, model, created, script, req, send)
        elif await finished([req]):
            body = json.dumps(final(call, model, created, script, req), separators=(",", ":")).encode()
            await respond(send, 200, body, JSON_HEADERS)


class Events:
    """The event sequence of one response: which output item is open, and the next sequence number."""

    def __init__(self) -> None:
        self.seq = 0
        self.out: list[bytes] = []
        self.state = ""  # "" | "text" | "call"
        self.index = 0  # output_index of the open (or next) item
        self.item_id = ""
        self.call_id = ""
        self.call = -1  # the open call's index in the answer
        self.name = ""
        self.text = ""  # the open item's text (content, or arguments)
        self.args_streamed = False

    def emit(self, kind: str, **fields: Any) -> None:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        self.out.append(b"event: " + kind.encode() + b"\ndata: " + json.dumps(event).encode() + b"\n\n")

    def take(self) -> bytes:
        data, self.out = b"".join(self.out), []
        return data

    def content(self, delta: str) -> None:
        if not delta:
            return
        if self.state != "text":
            self.close()
            self.state, self.item_id, self.text = "text", uuid.uuid4().hex, ""
            item = {"id": self.item_id, "content": [], "role": "assistant", "status": "in_progress", "type": "message"}
            self.emit("response.output_item.added", item=item, output_index=self.index)
            part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
            self.emit("response.content_part.added", content_index=0, item_id=self.item_id, output_index=self.index,
                      part=part)  # fmt: skip
        self.text += delta
        self.emit("response.output_text.delta", content_index=0, delta=delta, item_id=self.item_id, logprobs=[],
                  output_index=self.index)  # fmt: skip

    def tool_calls(self, deltas: list[dict[str, Any]]) -> None:
        first = deltas[0]
        if self.state != "call" or first["index"] != self.call:
            self.close()
            self.state, self.item_id, self.call_id = "call", uuid.uuid4().hex, f"call_{uuid.uuid4().hex}"
            self.call, self.name, self.text, self.args_streamed = first["index"], first["function"]["name"], "", False
            item = {"arguments": "", "call_id": self.call_id, "name": self.name, "type": "function_call",
                    "id": self.item_id, "namespace": None, "status": "in_progress"}  # fmt: skip
            self.emit("response.output_item.added", item=item, output_index=self.index)
        args = "".join(d["function"].get("arguments") or "" for d in deltas)
        if args:
            self.text += args
            self.args_streamed = True
            self.emit("response.function_call_arguments.delta", delta=args, item_id=self.item_id,
                      output_index=self.index)  # fmt: skip

    def close(self) -> None:
        """The open item's ``….done`` events."""
        if self.state == "text":
            self.emit("response.output_text.done", content_index=0, item_id=self.item_id, logprobs=[],
                      output_index=self.index, text=self.text)  # fmt: skip
            part: dict[str, Any] = {"annotations": [], "text": self.text, "type": "output_text", "logprobs": None}
            self.emit("response.content_part.done", content_index=0, item_id=self.item_id, output_index=self.index,
                      part=part)  # fmt: skip
            item: dict[str, Any] = {"id": self.item_id, "content": [part] if self.text else [], "role": "assistant",
                    "status": "completed", "type": "message", "summary": []}  # fmt: skip
            self.emit("response.output_item.done", item=item, output_index=self.index)
        elif self.state == "call":
            if self.args_streamed:
                self.emit("response.function_call_arguments.done", arguments=self.text, item_id=self.item_id,
                          output_index=self.index, name=self.name)  # fmt: skip
            item = {"arguments": self.text, "call_id": self.call_id, "name": self.name, "type": "function_call",
                    "id": self.item_id, "namespace": None, "status": "completed"}  # fmt: skip
            self.emit("response.output_item.done", item=item, output_index=self.index)
        else:
            return
        self.state = ""
        self.index += 1


async def _stream(call: ResponsesCall, model: str, created: int, script: Script | None, req: Request,
                  send: Send) -> None:  # fmt: skip
    ev = Events()
    opening = response_object(call, model, created, "in_progress", [], None)
    ev.emit("response.created", response=opening)
    ev.emit("response.in_progress", response=opening)
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    await send({"type": "http.response.body", "body": ev.take(), "more_body": True})
    ids = [f"chatcmpl-tool-{uuid.uuid4().hex}" for _ in script.calls] if script is not None else []
    async for start, stop in req.follow():
        for k in range(start, stop):
            if script is None:
                word = SPACED_WORDS[req.output[k]] if k else WORDS[req.output[k]]
                ev.content(word.decode())
                continue
            content, calls = script.delta(k, ids)
            if calls:
                ev.tool_calls(calls)
            elif content is not None:
                ev.content(content)
        if stop < req.final_len and ev.out:
            await send({"type": "http.response.body", "body": ev.take(), "more_body": True})
    if req.status is Status.ABORTED:
        return
    ev.close()
    ev.emit("response.completed", response=final(call, model, created, script, req))
    await send({"type": "http.response.body", "body": ev.take(), "more_body": False})
