"""The OpenAI wire format as vLLM's server speaks it: request parsing and response bodies.

Pure functions over dicts and bytes; the ASGI plumbing lives in :mod:`backends.sim.server`.
Streaming chunks are assembled from pre-encoded byte templates, one per request, because a
stream costs one chunk per token and ``json.dumps`` per chunk would dominate the CPU.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from backends.sim.errors import json_object
from backends.sim.textgen import VOCAB, WORDS_TOKENIZER, Tokenizer, chat_text
from backends.sim.tools import Structure, parse_chat, tools_prompt
from router.core.errors import SimApiError

WORDS = [w.encode() for w in VOCAB]
SPACED_WORDS = [b" " + w for w in WORDS]


COMPLETION_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class Completion:
    """A validated completion request."""

    chat: bool
    stream: bool
    include_usage: bool
    prompt_text: str  # what the answer's draws are keyed on
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    output_tokens: int | None
    difficulty: float | None
    seed: int | None
    random_sampling: bool = False  # temperature > 0 (absent: vLLM's default 1.0), so not a greedy argmax
    priority: int = 0  # vLLM's request priority (lower first): only --scheduling-policy priority reads it
    request_id: str | None = None  # the caller's X-Request-Id (the response's id is built on it)
    n: int = 1  # answers per prompt
    batch: tuple[tuple[str, list[int]], ...] = ()  # every prompt of a batched completion (text, ids), in order
    structure: Structure | None = None  # tools, tool_choice, a JSON response_format (chat, Responses)

    @property
    def choices(self) -> int:
        """How many answers the request asks for: ``n`` for each of its prompts."""
        return self.n * max(1, len(self.batch))


def parse_completion(
    body: bytes,
    chat: bool,
    served_model: str,
    max_model_len: int,
    tokenizer: Tokenizer = WORDS_TOKENIZER,
    request_id: str | None = None,
) -> Completion:
    req = json_object(body, served_model)
    structure: Structure | None = None
    if chat:
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages:
            raise SimApiError(400, "'messages' must be a non-empty list", "messages")
        try:
            text = chat_text(messages)
        except ValueError as exc:
            raise SimApiError(400, str(exc), "messages") from exc
        structure, tools = parse_chat(req, messages[-1].get("role") == "user")
        if tools:  # the template renders them into the prompt, ahead of the messages
            text = f"{tools_prompt(tools)} {text}"
        ids = tokenizer.encode_chat(text)
        batch = [(text, ids)]
    else:
        batch = _prompts(req.get("prompt"), tokenizer)
        text, ids = batch[0]
    if not all(b[1] for b in batch):
        raise SimApiError(400, "The prompt cannot be empty", "prompt")
    n = _opt_int(req, "n", 1)
    if n is None or n < 1:
        raise SimApiError(400, f"n must be at least 1, got {n}.", "n")
    stream = _bool(req, "stream")
    options = req.get("stream_options")
    if options is not None and not stream:
        raise SimApiError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    # as vLLM reads them: chat's max_completion_tokens wins over max_tokens; a completion without either
    # stops at 16 tokens (CompletionRequest's default, OpenAI's too), a chat answer at the context's end
    max_tokens = _opt_int(req, "max_tokens", None if chat else COMPLETION_DEFAULT_MAX_TOKENS)
    if chat:
        max_tokens = _opt_int(req, "max_completion_tokens", max_tokens)
    prompt_len = max(len(b[1]) for b in batch)  # a batch's longest prompt bounds its answers
    if max_tokens is None:
        max_tokens = max_model_len - prompt_len
    if max_tokens < 1:
        if prompt_len >= max_model_len:
            raise SimApiError(400, _too_long(max_model_len, prompt_len, max_tokens, chat), "messages")
        raise SimApiError(400, "max_tokens must be at least 1", "max_tokens")
    if prompt_len + max_tokens > max_model_len:
        raise SimApiError(400, _too_long(max_model_len, prompt_len, max_tokens, chat), "max_tokens")
    min_tokens = _opt_int(req, "min_tokens", 0) or 0
    if min_tokens < 0 or min_tokens > max_tokens:
        raise SimApiError(400, "min_tokens must be between 0 and max_tokens", "min_tokens")
    priority = _opt_int(req, "priority", 0) or 0  # vLLM 0.26 takes it under either policy (fcfs ignores it)
    output_tokens, difficulty = sim_fields(req)
    return Completion(
        chat=chat,
        stream=stream,
        include_usage=include_usage,
        prompt_text=text,
        prompt_ids=ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_bool(req, "ignore_eos"),
        output_tokens=output_tokens,
        difficulty=difficulty,
        seed=_opt_int(req, "seed", None),
        random_sampling=_random_sampling(req.get("temperature")),
        priority=priority,
        request_id=request_id,
        n=n,
        batch=tuple(batch),
        structure=structure,
    )


def packed_sim(req: dict[str, Any]) -> Any:
    """The ``sim`` object that a client packed as JSON in ``metadata["sim"]``, None where there is none; raises
    ValueError where that string is not JSON."""
    meta = req.get("metadata")
    return json.loads(meta["sim"]) if isinstance(meta, dict) and isinstance(meta.get("sim"), str) else None


def sim_fields(req: dict[str, Any]) -> tuple[int | None, float | None]:
    """The body's ``sim`` field, which only the sim reads: ``(output_tokens, difficulty)``. Without one, the same
    object as JSON in ``metadata["sim"]`` (OpenAI's string-valued metadata): a router that re-encodes requests in
    its own types (SGLang's) keeps that field and drops unknown ones."""
    sim = req.get("sim")
    if sim is None:
        try:
            sim = packed_sim(req)
        except ValueError:
            raise SimApiError(400, "metadata.sim must be a JSON object", "metadata.sim") from None
    sim = sim or {}
    if not isinstance(sim, dict):
        raise SimApiError(400, "'sim' must be an object", "sim")
    output_tokens = _opt_int(sim, "output_tokens", None, "sim.")
    if output_tokens is not None and output_tokens < 1:
        raise SimApiError(400, "sim.output_tokens must be at least 1", "sim.output_tokens")
    difficulty = sim.get("difficulty")
    if difficulty is not None and (
        isinstance(difficulty, bool) or not isinstance(difficulty, int | float) or not 0 <= difficulty <= 1
    ):
        raise SimApiError(400, "sim.difficulty must be a number in [0, 1]", "sim.difficulty")
    return output_tokens, None if difficulty is None else float(difficulty)


#: vLLM's threshold below which a temperature means greedy sampling (``_SAMPLING_EPS``).
SAMPLING_EPS = 1e-5


def _random_sampling(temperature: Any) -> bool:
    """Whether vLLM samples at random: a temperature of at least 1e-5, or none given (the server's default,
    1.0 for a model without a generation config, as the H200 test models)."""
    if temperature is None:
        return True
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not temperature >= 0:
        raise SimApiError(400, "temperature must be a non-negative number", "temperature")
    return temperature >= SAMPLING_EPS


def _prompts(prompt: Any, tokenizer: Tokenizer) -> list[tuple[str, list[int]]]:
    """A completion's prompts as (text, token ids): one string or list of token ids, or a batch of either."""
    if isinstance(prompt, str):
        return [(prompt, tokenizer.encode(prompt))]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [(" ".join(map(str, prompt)), list(prompt))]
        if all(isinstance(p, str) for p in prompt):
            return [(p, tokenizer.encode(p)) for p in prompt]
        if all(isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt):
            return [(" ".join(map(str, p)), list(p)) for p in prompt]
    raise SimApiError(400, "'prompt' must be a string, a list of token ids, or a list of either", "prompt")


def _too_long(max_model_len: int, prompt_len: int, max_tokens: int, chat: bool) -> str:
    where = "messages" if chat else "prompt"
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{prompt_len + max(max_tokens, 0)} tokens ({prompt_len} in the {where}, {max(max_tokens, 0)} "
        f"in the completion). Please reduce the length of the {where} or completion."
    )


_INT = TypeAdapter(int)  # vLLM's integer fields


def _opt_int(obj: dict[str, Any], key: str, default: int | None, prefix: str = "") -> int | None:
    """An integer field as vLLM's request models (pydantic, lax mode) read it: ``4.0`` and ``"4"`` are 4,
    ``4.5`` is a 400."""
    value = obj.get(key)
    if value is None:
        return default
    if type(value) is int:
        return value
    try:
        return _INT.validate_python(value)
    except ValidationError as exc:
        raise SimApiError(400, f"'{prefix}{key}': {exc.errors()[0]['msg']}", prefix + key) from None


def _bool(obj: dict[str, Any], key: str) -> bool:
    value = obj.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise SimApiError(400, f"'{key}' must be a boolean", key)
    return value


# -- responses ------------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def answer_key(c: Completion, text: str, choice: int = 0) -> str:
    """What a prompt's answer is drawn on: its text (and the request's ``seed``); answer ``choice`` > 0 of an
    ``n`` > 1 request on a key of its own, so that the answers differ."""
    key = text if c.seed is None else f"{c.seed}\x00{text}"
    return f"{key}\x00choice {choice}" if choice else key


_ID_SAFE = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def new_id(chat: bool, request_id: str | None = None) -> str:
    """The response's id: vLLM's ``chatcmpl-`` / ``cmpl-`` and the caller's X-Request-Id where it gave a usable
    one (as vLLM's ``_base_request_id``), else a random one."""
    base = request_id if request_id and _ID_SAFE.fullmatch(request_id) else uuid.uuid4().hex
    return ("chatcmpl-" if chat else "cmpl-") + base


def full_response(
    req_id: str, chat: bool, model: str, text: str, finish_reason: str, prompt_tokens: int, n_out: int
) -> bytes:
    return full_response_many(req_id, chat, model, [(text, finish_reason)], prompt_tokens, n_out)


def full_response_many(
    req_id: str, chat: bool, model: str, answers: Sequence[tuple[str, str]], prompt_tokens: int, n_out: int
) -> bytes:
    """A non-streamed answer of one choice per (text, finish_reason), indexed in order."""
    choices: list[dict[str, Any]] = []
    for index, (text, finish_reason) in enumerate(answers):
        if chat:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "tool_calls": [],
                "reasoning_content": None,
            }
            choices.append({"index": index, "message": message, "logprobs": None, "finish_reason": finish_reason,
                            "stop_reason": None})  # fmt: skip
        else:
            choices.append({"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason,
                            "stop_reason": None, "prompt_logprobs": None})  # fmt: skip
    body = {
        "id": req_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, n_out),
    }
    return json.dumps(body, separators=(",", ":")).encode()


class ChunkWriter:
    """Byte templates of one request's SSE stream: ``head + word + tail``."""

    __slots__ = ("_envelope", "_index", "chat", "final_tail", "head", "tail")

    def __init__(self, req_id: str, chat: bool, model: str, index: int = 0) -> None:
        self.chat = chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._envelope = (
            f'{{"id":"{req_id}","object":"{obj}","created":{int(time.time())},"model":{json.dumps(model)},'
        ).encode()
        self._index = b'"choices":[{"index":%d,' % index
        if chat:
            self.head = b"data: " + self._envelope + self._index + b'"delta":{"content":"'
            self.tail = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
            self.final_tail = b'"},"logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n'
        else:
            self.head = b"data: " + self._envelope + self._index + b'"text":"'
            self.tail = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self.final_tail = b'","logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n'

    def role_chunk(self) -> bytes:
        """vLLM opens a chat stream with the assistant role and empty content (once per choice)."""
        return (
            b"data: " + self._envelope + self._index + b'"delta":{"role":"assistant",'
            b'"content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def token_chunks(self, out: list[int], start: int, stop: int, finish_reason: str | None = None) -> list[bytes]:
        """The chunks of tokens ``out[start:stop]`` (a space before every word but the answer's first); with
        ``finish_reason``, the last of them is the finishing chunk that carries it."""
        head, tail, words, spaced = self.head, self.tail, WORDS, SPACED_WORDS
        last = stop - 1 if finish_reason is not None else stop
        parts = [head + (spaced[out[i]] if i else words[out[i]]) + tail for i in range(start, last)]
        if finish_reason is not None:
            word = spaced[out[last]] if last else words[out[last]]
            parts.append(head + word + self.final_tail % finish_reason.encode())
        return parts

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        u = json.dumps(usage(prompt_tokens, completion_tokens), separators=(",", ":")).encode()
        return b"data: " + self._envelope + b'"choices":[],"usage":' + u + b"}\n\n"


DONE = b"data: [DONE]\n\n"
PID_HEADER = "x-chimera-sim-pid"  # the sim's pid in its /health answer: `chimera serve` checks it started that one
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
