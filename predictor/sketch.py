"""Cheap text features a gateway computes once per request: a hashed sketch and prefix-block hashes.

Neither needs a tokenizer. The **sketch** is scikit-learn's ``HashingVectorizer`` over the words of a
bounded head and tail of the prompt, hashed into :data:`SKETCH_DIM` signed buckets and L2-normalised (the
hashing trick is itself the reduction: a random projection of the bag of words). The **prefix
hashes** approximate the worker's KV block hashes: vLLM (and the simulator) hash each full block of
16 tokens chained to its parent; the gateway cannot tokenize, so it hashes chunks of
:data:`WORDS_PER_BLOCK` whitespace words, chained (``crc32(chunk, parent)``), which is stable across
processes, so gateway replicas share them (:mod:`predictor.prefix`).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
from sklearn.feature_extraction.text import HashingVectorizer

SKETCH_DIM = 64
TERM_BITS = 12  # task terms are hashed into 2**TERM_BITS ids: few collisions among a prompt's distinct words
N_TERMS = 1 << TERM_BITS
TASK_CHARS = 2048  # the task terms read the first user message up to here (plus the prompt's tail)
SKETCH_HEAD_CHARS = 768  # the sketch reads the prompt's head (task, system prompt) and tail (the latest
SKETCH_TAIL_CHARS = 256  # instruction of a multi-turn prompt): cost is bounded whatever the prompt's size
WORDS_PER_BLOCK = 16
MAX_BLOCKS = 256  # prefix hashes cover at most this many leading blocks
TEXT_CHARS = 64 * 1024  # the text gathered from a body is cut here (prefix blocks beyond are not hashed)

# A callable analyzer skips sklearn's regex tokenizer and preprocessing (the costly part per call). One
# vectorizer serves both the sketch and the terms: murmurhash modulo N_TERMS, folded modulo SKETCH_DIM
# (a divisor), is the same bucket as modulo SKETCH_DIM directly.
_VECTORIZER = HashingVectorizer(n_features=N_TERMS, analyzer=str.split, alternate_sign=True, norm=None)


def messages_of(endpoint: str, payload: Any) -> list[Any]:
    """A chat's messages; a Responses API request's ``instructions`` and ``input`` as messages (its items'
    text in ``content``: a function call's arguments, a call output's ``output``); else ``[]``."""
    if endpoint == "chat":
        messages = payload.get("messages")
        return messages if isinstance(messages, list) else []
    if endpoint != "responses":
        return []
    out: list[Any] = []
    if isinstance(payload.get("instructions"), str):
        out.append({"role": "system", "content": payload["instructions"]})
    items = payload.get("input")
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        if "role" in item:
            out.append(item)
        elif item.get("type") == "function_call_output":
            out.append({"role": "tool", "content": item.get("output")})
        elif item.get("type") == "function_call":
            out.append({"role": "assistant", "content": f"{item.get('name', '')} {item.get('arguments', '')}"})
    return out


def prompt_text(endpoint: str, payload: Any, limit: int = TEXT_CHARS) -> str:
    """The prompt's text as the simulator sees it (a chat: each message's role, then its content),
    cut at ``limit`` characters. Token-id prompts have no text: ``""``."""
    parts: list[str] = []
    size = 0
    if endpoint in ("chat", "responses"):
        for m in messages_of(endpoint, payload):
            if not isinstance(m, dict):
                continue
            parts.append(str(m.get("role", "")))
            content = m.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
            size += sum(len(p) for p in parts[-2:])
            if size > limit:
                break
    else:
        prompt = payload.get("prompt")
        if isinstance(prompt, str):
            parts.append(prompt)
        elif isinstance(prompt, list):
            parts.extend(p for p in prompt if isinstance(p, str))
    return " ".join(parts)[:limit]


def task_text(endpoint: str, payload: Any, limit: int = TASK_CHARS) -> str:
    """What the request asks: a chat's first user message (a multi-agent workflow's shared task), else
    the prompt's head; cut at ``limit`` characters."""
    if endpoint in ("chat", "responses"):
        for m in messages_of(endpoint, payload):
            if isinstance(m, dict) and m.get("role") == "user":
                content = m.get("content")
                if isinstance(content, list):
                    content = " ".join(
                        p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
                    )
                return content[:limit] if isinstance(content, str) else ""
        return ""
    return prompt_text(endpoint, payload, limit)


def sketch(text: str) -> tuple[float, ...]:
    """A :data:`SKETCH_DIM`-dimensional, L2-normalised hashed bag of the lower-cased words of the
    prompt's head and tail."""
    return text_features(text, "")[0]


def text_features(text: str, task: str) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """(the :func:`sketch` of ``text``, the task terms): the sorted distinct hashed ids (< :data:`N_TERMS`)
    of the lower-cased words of ``task`` and of ``text``'s tail — the prompt's topic words, which the
    quality model reads (a 64-bucket sketch drowns them among the other words). One vectorizer call."""
    if len(text) > SKETCH_HEAD_CHARS + SKETCH_TAIL_CHARS:
        head_tail = text[:SKETCH_HEAD_CHARS] + " " + text[-SKETCH_TAIL_CHARS:]
    else:
        head_tail = text
    m = _VECTORIZER.transform([head_tail.lower(), (task + " " + text[-SKETCH_TAIL_CHARS:]).lower()])
    lo, hi = m.indptr[1], m.indptr[2]
    v = np.zeros(SKETCH_DIM)
    np.add.at(v, m.indices[:lo] % SKETCH_DIM, m.data[:lo])
    n = float(np.sqrt(v @ v))
    dense = tuple((v / n).tolist()) if n > 0 else (0.0,) * SKETCH_DIM
    return dense, tuple(np.unique(m.indices[lo:hi]).tolist())


def prefix_hashes(text: str, max_blocks: int = MAX_BLOCKS) -> tuple[int, ...]:
    """Chained hashes of the text's leading full blocks of :data:`WORDS_PER_BLOCK` words; the block's
    depth is mixed into the high bits so two depths never share a key."""
    words = text.split(maxsplit=WORDS_PER_BLOCK * max_blocks)[: WORDS_PER_BLOCK * max_blocks]
    out: list[int] = []
    h = 0
    for i in range(len(words) // WORDS_PER_BLOCK):
        h = zlib.crc32(" ".join(words[i * WORDS_PER_BLOCK : (i + 1) * WORDS_PER_BLOCK]).encode(), h)
        out.append(h | (i << 32))
    return tuple(out)
