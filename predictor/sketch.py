"""Cheap text features a gateway computes once per request: a hashed sketch and prefix-block hashes.

Neither needs a tokenizer. The **sketch** is scikit-learn's ``HashingVectorizer`` over the words of a
bounded head and tail of the prompt, hashed into :data:`SKETCH_DIM` signed buckets and L2-normalised (the
hashing trick is itself the reduction: a random projection of the bag of words). The **prefix
hashes** approximate the worker's KV block hashes: vLLM (and the simulator) hash each full block of
16 tokens chained to its parent; the gateway cannot tokenize, so it hashes chunks of
:data:`WORDS_PER_BLOCK` whitespace words, chained (``crc32(chunk, parent)``), which is stable across
processes and so could later be shared between gateway replicas.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
from sklearn.feature_extraction.text import HashingVectorizer

SKETCH_DIM = 64
SKETCH_HEAD_CHARS = 768  # the sketch reads the prompt's head (task, system prompt) and tail (the latest
SKETCH_TAIL_CHARS = 256  # instruction of a multi-turn prompt): cost is bounded whatever the prompt's size
WORDS_PER_BLOCK = 16
MAX_BLOCKS = 256  # prefix hashes cover at most this many leading blocks
TEXT_CHARS = 64 * 1024  # the text gathered from a body is cut here (prefix blocks beyond are not hashed)

# A callable analyzer skips sklearn's regex tokenizer and preprocessing (the costly part per call).
_VECTORIZER = HashingVectorizer(n_features=SKETCH_DIM, analyzer=str.split, alternate_sign=True, norm=None)


def prompt_text(endpoint: str, payload: Any, limit: int = TEXT_CHARS) -> str:
    """The prompt's text as the simulator sees it (a chat: each message's role, then its content),
    cut at ``limit`` characters. Token-id prompts have no text: ``""``."""
    parts: list[str] = []
    size = 0
    if endpoint == "chat":
        for m in payload.get("messages") or ():
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


def sketch(text: str) -> tuple[float, ...]:
    """A :data:`SKETCH_DIM`-dimensional, L2-normalised hashed bag of the lower-cased words of the
    prompt's head and tail."""
    if len(text) > SKETCH_HEAD_CHARS + SKETCH_TAIL_CHARS:
        text = text[:SKETCH_HEAD_CHARS] + " " + text[-SKETCH_TAIL_CHARS:]
    m = _VECTORIZER.transform([text.lower()])
    v = np.zeros(SKETCH_DIM)
    np.add.at(v, m.indices, m.data)
    n = float(np.sqrt(v @ v))
    return tuple((v / n).tolist()) if n > 0 else (0.0,) * SKETCH_DIM


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
