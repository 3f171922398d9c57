"""vLLM's ``POST /v1/embeddings`` for a worker started with ``--runner pooling`` (an embedding model).

Each input is one engine request that prefills its prompt and ends (a pooling model samples nothing), so embeddings
take the GPU's time, its running slots and KV as vLLM's do. ``input`` is a string, a list of strings, a list of
token ids or a list of those; the answer is OpenAI's list of embeddings (``float`` or ``base64``), each a unit
vector drawn from the input's token ids (the same input, the same vector), with ``usage.prompt_tokens``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import struct
from typing import Any

from backends.sim.engine import Engine
from backends.sim.errors import invalid_field, json_object
from backends.sim.request import Request, Status
from backends.sim.textgen import Answer, Tokenizer
from router.core.errors import SimApiError

DIMENSIONS = 384  # as a small sentence-embedding model's


def inputs(req: dict[str, Any], tokenizer: Tokenizer) -> list[list[int]]:
    """Each input's token ids; a 400 as vLLM words it for a missing or malformed ``input``."""
    given = req.get("input")
    if isinstance(given, str):
        return [tokenizer.encode(given)]
    if isinstance(given, list) and given:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in given):
            return [list(given)]
        if all(isinstance(t, str) for t in given):
            return [tokenizer.encode(t) for t in given]
        if all(isinstance(t, list) and all(isinstance(i, int) for i in t) for t in given):
            return [list(t) for t in given]
    if given is None:
        raise invalid_field(("input",), "Field required", req, "missing")
    raise invalid_field(("input",), "Input should be a string, a list of strings or token ids", given, "union_type")


def vector(ids: list[int], dimensions: int) -> list[float]:
    """A unit vector drawn from ``ids``."""
    raw = b"".join(hashlib.blake2b(f"{i}:{ids}".encode(), digest_size=64).digest() for i in range(dimensions // 16 + 1))
    values = [(b - 127.5) / 127.5 for b in raw[: dimensions * 4 : 4]]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [v / norm for v in values]


async def embed(engine: Engine, model: str, tokenizer: Tokenizer, max_model_len: int, body: bytes) -> bytes:
    """The answer to one ``/v1/embeddings`` body, once the engine has prefilled every input."""
    req = json_object(body)
    fmt = req.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise invalid_field(("encoding_format",), "Input should be 'float' or 'base64'", fmt, "literal_error")
    dims = req.get("dimensions") or DIMENSIONS
    if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= DIMENSIONS:
        raise SimApiError(400, f"dimensions must be an integer from 1 to {DIMENSIONS}", "dimensions")
    prompts = inputs(req, tokenizer)
    for ids in prompts:
        if not ids:
            raise SimApiError(400, "The prompt cannot be empty.", "input")
        if len(ids) > max_model_len:
            raise SimApiError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{len(ids)} tokens in the input for embedding generation.",
                "input",
            )
    loop = asyncio.get_running_loop()
    one = Answer(natural_tokens=1, word_start=0, marker=None)  # a pooling request ends at its prefill
    now = loop.time()
    reqs = [Request(f"embd-{id(ids):x}-{n}", ids, one, 1, 0, False, arrival=now) for n, ids in enumerate(prompts)]
    for r in reqs:
        engine.submit(r)
    try:
        for r in reqs:
            while not r.done:
                await r.wait_for_output(len(r.output))
            if r.status is not Status.FINISHED:
                raise SimApiError(500, "the request was aborted", None)
    finally:
        for r in reqs:
            engine.abort(r)  # a no-op once finished
    data = []
    for n, ids in enumerate(prompts):
        v = vector(ids, dims)
        shown: Any = base64.b64encode(struct.pack(f"<{dims}f", *v)).decode() if fmt == "base64" else v
        data.append({"object": "embedding", "index": n, "embedding": shown})
    used = sum(len(ids) for ids in prompts)
    answer = {"id": reqs[0].request_id, "object": "list", "created": int(loop.time()), "model": model, "data": data,
              "usage": {"prompt_tokens": used, "total_tokens": used, "completion_tokens": 0}}  # fmt: skip
    return json.dumps(answer).encode()
