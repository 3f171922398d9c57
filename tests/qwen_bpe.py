"""Qwen2.5's BPE tokenizer, offline: the 151,643 byte-level merges Qwen, Qwen1.5, Qwen2 and Qwen2.5 share, as the
``dashscope`` package ships them (``dashscope/resources/qwen.tiktoken``), run by tiktoken with Qwen's pre-tokenizer
pattern and its NFC normalisation. Special tokens are left out: :func:`chat_tokens` adds what Qwen2.5's chat
template puts around the messages.

The package is found, not imported (importing it starts its SDK); where it is missing the tests that need it skip.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import pytest

# Qwen2's pre-tokenizer (its tokenizer.json and dashscope's qwen_tokenizer.py): digits one by one.
PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen2.5's template: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, "<|im_start|>assistant\n" to end,
# and a default system message where the chat has none.
MESSAGE_TOKENS, GENERATION_TOKENS = 4, 3  # <|im_start|>, "\n", <|im_end|>, "\n" (and the role's); the last
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def vocabulary_file() -> Path | None:
    spec = importlib.util.find_spec("dashscope")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"
    return path if path.is_file() else None


@functools.cache
def _encoding() -> object:
    tiktoken = pytest.importorskip("tiktoken")
    path = vocabulary_file()
    if path is None:
        pytest.skip("Qwen's vocabulary ships with the dashscope package (the dev extra), which is not installed")
    lines = (ln.split() for ln in path.read_bytes().splitlines() if ln)
    ranks = {base64.b64decode(tok): int(rank) for tok, rank in lines}
    return tiktoken.Encoding("qwen2.5", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={})


def tokens(text: str) -> int:
    """Qwen2.5's token count of ``text``."""
    enc = _encoding()
    return len(enc.encode_ordinary(unicodedata.normalize("NFC", text)))  # type: ignore[attr-defined]


def chat_tokens(messages: Sequence[dict[str, str]]) -> int:
    """What a vLLM worker serving Qwen2.5 reports as ``usage.prompt_tokens`` for a chat of plain messages."""
    total = GENERATION_TOKENS + sum(MESSAGE_TOKENS + tokens(m["role"]) + tokens(m["content"]) for m in messages)
    if not messages or messages[0]["role"] != "system":
        total += MESSAGE_TOKENS + tokens("system") + tokens(DEFAULT_SYSTEM)
    return total
