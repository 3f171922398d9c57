"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` (``vllm/entrypoints/serve/tokenize/``) with the sim's tokenizer.

``/tokenize`` takes a ``prompt`` (a completion's) or ``messages`` (a chat's, with ``tools`` and
``add_generation_prompt``) and answers ``{"count", "max_model_len", "tokens", "token_strs"}``, the ids a
completion or chat request with that input is charged for. ``/detokenize`` takes ``tokens`` and answers
``{"prompt"}``. The word-level tokenizer inverts every id of its vocabulary; the default one (a CRC-32 per
word, or per piece of CJK text) inverts the sim's own answer words and the pieces this worker has tokenized
lately, and skips any other id, as a tokenizer's ``decode`` skips ids it has no token for. The ids are those
a request's ``usage`` counts, so ``count`` is its ``prompt_tokens``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from backends.sim.errors import invalid_field, json_object, rejected
from backends.sim.textgen import UNK_ID, VOCAB, VOCAB_IDS, Tokenizer, chat_text
from backends.sim.tools import chat_tools, tools_prompt
from router.core.errors import SimApiError

REMEMBERED_WORDS = 65536  # words /tokenize keeps for /detokenize (default tokenizer)
_OWN = dict(zip(VOCAB_IDS, VOCAB, strict=True))


class Tokenization:
    """The two endpoints of one worker."""

    def __init__(self, tokenizer: Tokenizer, model: str, max_model_len: int) -> None:
        self.tokenizer, self.model, self.max_model_len = tokenizer, model, max_model_len
        self._seen: OrderedDict[int, str] = OrderedDict()

    def tokenize(self, body: bytes) -> bytes:
        req = self._request(body)
        if "messages" in req:
            messages = req["messages"]
            if not isinstance(messages, list):
                raise invalid_field(("messages",), "Input should be a valid list", messages, "list_type")
            if req.get("continue_final_message") and req.get("add_generation_prompt", True):
                raise rejected("Cannot set both `continue_final_message` and `add_generation_prompt` to True.", "body")
            try:
                text = chat_text(messages)
            except ValueError as exc:
                raise SimApiError(400, str(exc), "messages") from exc
            tools = req.get("tools")
            if tools is not None:
                chat_tools(tools)
                text = f"{tools_prompt(tools)} {text}" if tools else text
            prompt = self.tokenizer.encode_chat if req.get("add_generation_prompt", True) else self.tokenizer.encode
            ids = prompt(text)
        elif isinstance(req.get("prompt"), str):
            text = req["prompt"]
            ids = self.tokenizer.encode(text)
        else:
            raise invalid_field(("prompt",), "Field required", req, "missing")
        if self.tokenizer.kind == "words":
            for piece, i in zip(self.tokenizer.pieces(text), ids, strict=False):
                self._remember(i, piece)
        strs = [self._token(i) or "<unk>" for i in ids] if req.get("return_token_strs") else None
        out = {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}
        return json.dumps(out).encode()

    def detokenize(self, body: bytes) -> bytes:
        req = self._request(body)
        tokens = req.get("tokens")
        if tokens is None:
            raise invalid_field(("tokens",), "Field required", req, "missing")
        if not isinstance(tokens, list):
            raise invalid_field(("tokens",), "Input should be a valid list", tokens, "list_type")
        for i, t in enumerate(tokens):
            if isinstance(t, bool) or not isinstance(t, int):
                raise invalid_field(("tokens", i), "Input should be a valid integer", t, "int_type")
            if t < 0:
                raise invalid_field(("tokens", i), "Input should be greater than or equal to 0", t,
                                    "greater_than_equal")  # fmt: skip
        words = [w for w in map(self._token, tokens) if w is not None]
        return json.dumps({"prompt": " ".join(words)}).encode()

    def _request(self, body: bytes) -> dict[str, Any]:
        return json_object(body, self.model)

    def _remember(self, token: int, word: str) -> None:
        seen = self._seen
        seen[token] = word
        seen.move_to_end(token)
        if len(seen) > REMEMBERED_WORDS:
            seen.popitem(last=False)

    def _token(self, token: int) -> str | None:
        """The word an id stands for, or None where the tokenizer has none."""
        own = _OWN.get(token)
        if own is not None:
            return own
        if self.tokenizer.kind == "words":
            return self._seen.get(token)
        if token == UNK_ID:
            return "<unk>"
        return f"w{token}" if 3 <= token < self.tokenizer.vocab_size else None
