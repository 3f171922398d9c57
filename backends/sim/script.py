"""Answers drawn whole before the engine runs — tool calls and JSON documents — one text piece per token.

A plain answer is one vocabulary word per token (:mod:`backends.sim.textgen`); a structured one is the
text a model would write, cut the way a BPE tokenizer cuts JSON (``{"``, ``name``, ``":``, `` "``, ...;
Hermes' ``<tool_call>`` tags one token each), and the engine's ``k``-th token is its ``k``-th piece, so
``usage`` counts the pieces. What the model writes, as vLLM 0.26 makes it (``vllm/tool_parsers/``):

- ``tool_choice: "auto"``: Hermes blocks, ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  parsed by vLLM's hermes parser.
- a named function: its arguments object alone (guided decoding on the tool's parameter schema).
- ``"required"``: ``[{"name": ..., "parameters": {...}}, ...]`` (guided decoding on the tools' schema).
- a JSON ``response_format``: the document itself.

Each piece records what vLLM's streaming parser emits when that token arrives (the call a piece opens,
the text it adds to a call's arguments), which is how :meth:`Script.delta` reproduces vLLM's deltas
without re-parsing the text. With ``parallel_tool_calls`` (the default) a turn makes one or two calls,
half the time each; arguments are drawn from each tool's schema (:mod:`backends.sim.schema`).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from typing import Any

from backends.sim.schema import draw_value
from backends.sim.textgen import VOCAB, VOCAB_SIZE
from backends.sim.tools import NAMED, REQUIRED, Structure

TOOL_START, TOOL_END = "<tool_call>", "</tool_call>"
_PIECES = re.compile(r"\s*[A-Za-z0-9_]+|\s*[^\sA-Za-z0-9_]+|\s+")
_SPECIAL = re.compile(f"({re.escape(TOOL_START)}|{re.escape(TOOL_END)})")
_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
PAD = " "  # what a token past the script's end writes (min_tokens, ignore_eos): JSON and tags stay valid

AUTO_MODE, NAMED_MODE, REQUIRED_MODE, JSON_MODE = "auto", "named", "required", "json"


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class Piece:
    text: str
    call: int = -1  # the call it opens or whose arguments it extends; -1: neither
    args: str = ""  # what it adds to that call's arguments in a stream
    opens: bool = False  # the parser announces the call (id, name) with this token


@dataclass(frozen=True)
class Outcome:
    """What vLLM's parser makes of a finished answer."""

    content: str | None
    calls: tuple[Call, ...]


@dataclass(frozen=True)
class Script:
    mode: str  # auto | named | required | json
    pieces: tuple[Piece, ...]
    calls: tuple[Call, ...]

    def piece(self, i: int) -> Piece:
        return self.pieces[i] if i < len(self.pieces) else Piece(PAD)

    def text(self, n: int) -> str:
        """The answer's first ``n`` tokens."""
        return "".join(p.text for p in self.pieces[:n]) + PAD * max(0, n - len(self.pieces))

    def delta(self, i: int, ids: list[str]) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, tool-call deltas) vLLM's streaming parser emits for token ``i``; ``ids[c]``: call c's id."""
        p = self.piece(i)
        if self.mode == JSON_MODE:
            return p.text, []
        if self.mode == NAMED_MODE:  # every token is argument text; the first also carries id and name
            if i == 0:
                fn = {"name": self.calls[0].name, "arguments": p.text}
                return None, [{"id": ids[0], "type": "function", "index": 0, "function": fn}]
            return None, [{"index": 0, "function": {"arguments": p.text}}]
        c = p.call
        if c < 0:
            return None, []
        name = self.calls[c].name
        if self.mode == REQUIRED_MODE:
            if p.opens:
                fn = {"name": name, "arguments": p.args}
                return None, [{"id": ids[c], "type": "function", "index": c, "function": fn}]
            return None, [{"index": c, "function": {"name": None, "arguments": p.args}}]
        out: list[dict[str, Any]] = []  # hermes: the name once it is complete, then argument diffs
        if p.opens:
            out.append({"id": ids[c], "type": "function", "index": c, "function": {"name": name}})
        if p.args:
            out.append({"index": c, "function": {"arguments": p.args}})
        return None, out

    def outcome(self, n: int) -> Outcome:
        """The finished answer of ``n`` tokens as vLLM parses it (``n`` short of the script: cut by max_tokens)."""
        text = self.text(n)
        if self.mode == JSON_MODE:
            return Outcome(text, ())
        if self.mode == NAMED_MODE:
            return Outcome(None, (Call(self.calls[0].name, text),) if text.strip() else ())
        if self.mode == REQUIRED_MODE:
            try:
                items = json.loads(text)
                calls = tuple(Call(it["name"], json.dumps(it["parameters"], ensure_ascii=False)) for it in items)
            except (ValueError, TypeError, KeyError):
                calls = ()
            return Outcome(None, calls)
        return _hermes(text)


def _hermes(text: str) -> Outcome:
    """vLLM's ``Hermes2ProToolParser.extract_tool_calls``: any block that does not parse voids them all."""
    if TOOL_START not in text:
        return Outcome(text, ())
    try:
        found = [json.loads(a or b) for a, b in _HERMES.findall(text)]
        calls = tuple(Call(f["name"], json.dumps(f["arguments"], ensure_ascii=False)) for f in found)
    except (ValueError, TypeError, KeyError):
        return Outcome(text, ())
    return Outcome(text[: text.find(TOOL_START)] or None, calls)


def draw_script(s: Structure, seed: int, model: str, key: str) -> Script:
    """The structured answer to a request of structure ``s`` (``s.scripted``), drawn on ``key``."""
    digest = hashlib.blake2b(repr((seed, model, key, "script")).encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "big"))
    if not s.calls_tools:
        value = draw_value(s.json_schema, rng) if s.json_schema is not None else _any_object(rng)
        return _build(JSON_MODE, [(json.dumps(value, ensure_ascii=False), -1, False)], ())
    if s.choice == NAMED:
        tool = s.tool(s.named)
        call = Call(tool.name, _arguments(tool.parameters, rng))
        return _build(NAMED_MODE, [(call.arguments, 0, False)], (call,))
    tools = list(s.tools)
    count = 2 if s.parallel and rng.random() < 0.5 else 1
    calls = tuple(Call(t.name, _arguments(t.parameters, rng)) for t in (rng.choice(tools) for _ in range(count)))
    parts: list[tuple[str, int, bool]] = []  # (text, call whose arguments it is, closes the call's name)
    if s.choice == REQUIRED:
        parts.append(("[", -1, False))
        for c, call in enumerate(calls):
            parts += [(', {"name": ' if c else '{"name": ', -1, False), (json.dumps(call.name), c, True),
                      (', "parameters": ', -1, False), (call.arguments, c, False), ("}", -1, False)]  # fmt: skip
        parts.append(("]", -1, False))
        return _build(REQUIRED_MODE, parts, calls)
    for c, call in enumerate(calls):
        parts += [("\n" if c else "", -1, False), (TOOL_START + '\n{"name": ', -1, False),
                  (json.dumps(call.name), c, True), (', "arguments": ', -1, False), (call.arguments, c, False),
                  ("}\n" + TOOL_END, -1, False)]  # fmt: skip
    return _build(AUTO_MODE, parts, calls)


def _arguments(parameters: dict[str, Any] | None, rng: random.Random) -> str:
    value = draw_value(parameters, rng) if parameters else {}
    return json.dumps(value if isinstance(value, dict) else {}, ensure_ascii=False)


def _any_object(rng: random.Random) -> dict[str, str]:
    """A ``json_object`` answer: any object, here one to three string fields."""
    keys = [VOCAB[rng.randrange(VOCAB_SIZE)] for _ in range(rng.randint(1, 3))]
    return {k: VOCAB[rng.randrange(VOCAB_SIZE)] for k in keys}


def _build(mode: str, parts: list[tuple[str, int, bool]], calls: tuple[Call, ...]) -> Script:
    """Cut the concatenated ``parts`` into pieces, each tagged with the call text it carries.

    A part ``(text, c, True)`` is call ``c``'s quoted name (the hermes parser announces the call once the
    closing quote arrives); ``(text, c, False)`` with ``c >= 0`` its arguments.
    """
    text, arg_of, name_end = "", [], {}
    for part, c, is_name in parts:
        if is_name:
            name_end[len(text) + len(part) - 1] = c
        arg_of += [c if not is_name else -1] * len(part)
        text += part
    pieces: list[Piece] = []
    opened: set[int] = set()
    offset = 0
    for chunk in _SPECIAL.split(text):
        spans = [(offset, offset + len(chunk))] if _SPECIAL.fullmatch(chunk) else [
            (offset + m.start(), offset + m.end()) for m in _PIECES.finditer(chunk)]  # fmt: skip
        for a, b in spans:
            owners = [arg_of[j] for j in range(a, b) if arg_of[j] >= 0]
            args = "".join(text[j] for j in range(a, b) if arg_of[j] >= 0)
            call, opens = (owners[0], False) if owners else (-1, False)
            if mode == AUTO_MODE:
                named = [name_end[j] for j in range(a, b) if j in name_end]
                if named:
                    call, opens = named[0], True
            elif mode == REQUIRED_MODE and owners and call not in opened:
                opens = True  # vLLM names the call once its parameters begin
            if opens:
                opened.add(call)
            pieces.append(Piece(text[a:b], call, args, opens))
        offset += len(chunk)
    return Script(mode, tuple(pieces), calls)
