"""Deterministic stand-ins for a tokenizer and a model's answer.

One token per whitespace-separated word, mapped to an int by CRC-32 (stable across processes), except
for Chinese, Japanese and Korean, which are written without spaces between words: a run of ``n`` Han
characters, kana or Hangul syllables is ``max(1, round(n * rate))`` tokens (:data:`CJK_RATES`), cut at
equal intervals, and each CJK punctuation mark (U+3000-U+303F, U+FF00-U+FFEF) is a token of its own.
The rates are Qwen2.5's, measured with its BPE vocabulary (151,643 merges, shipped as ``qwen.tiktoken``
in the ``dashscope`` package, run by tiktoken) and fitted under this rule: on 18,919 Han characters of
Chinese (the prose of ``tests/multilingual.py``, MySQL's Chinese error messages, dashscope's Chinese
README) the rule's count is within 2 % of Qwen2.5's, on 9,257 characters of Japanese within 1 %, on
2,742 Hangul syllables of Korean within 3 %. (Qwen2.5 itself: 0.61 tokens per Han character plus 0.13
per run.)
A profile may instead name the word-level tokenizer the H200 test models were served with
(:class:`Tokenizer`, ``"tokenizer": {"kind": "wordlevel"}``). Generated text is one word per token
(``tok<k>``), so usage counts are exact and re-tokenizing an answer gives back its token count.
Every random choice about a request is derived from a hash of ``(seed, model, prompt text, ...)``,
never from arrival order, so answers are reproducible.

Correctness model: with ``sim.difficulty = D`` the answer ends in ``[correct]`` with probability
``1 / (1 + exp(-CORRECTNESS_SLOPE * (quality - D)))`` and in ``[wrong]`` otherwise.
"""

from __future__ import annotations

import hashlib
import math
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from router.core.profile import TokenizerSpec

VOCAB_SIZE = 4096  # a power of two: word index k * ODD_STRIDE mod VOCAB_SIZE visits every word
_STRIDE = 2654435761
CORRECT, WRONG = "[correct]", "[wrong]"
CORRECTNESS_SLOPE = 8.0
DEFAULT_MEDIAN_TOKENS = 150.0
DEFAULT_SIGMA = 0.8  # of log(output tokens)

VOCAB = [f"tok{k}" for k in range(VOCAB_SIZE)] + [CORRECT, WRONG]
VOCAB_IDS = [zlib.crc32(w.encode()) for w in VOCAB]
MARKER_INDEX = {CORRECT: VOCAB_SIZE, WRONG: VOCAB_SIZE + 1}


# Tokens per character of a run of one script, Qwen2.5's BPE as measured (see the module's docstring).
CJK_RATES = {"han": 0.64, "kana": 0.50, "hangul": 0.80}
_CJK_PIECES = re.compile(
    "(?P<han>[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+)|(?P<kana>[\u3040-\u30ff\u31f0-\u31ff]+)"
    "|(?P<hangul>[\uac00-\ud7af]+)|(?P<mark>[\u3000-\u303f\uff00-\uffef])"
    "|[^\u3000-\u303f\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]+"
)


def pieces(text: str) -> list[str]:
    """The prompt's tokens as text: its whitespace-separated words, a word holding CJK text cut further
    (runs of one script at their rate, a CJK punctuation mark alone, the rest of the word as one piece)."""
    words = text.split()
    if text.isascii():  # O(1) in CPython: the usual prompt takes the plain path
        return words
    out: list[str] = []
    for w in words:
        if w.isascii():
            out.append(w)
            continue
        for m in _CJK_PIECES.finditer(w):
            run, script = m.group(), m.lastgroup
            if script is None or script == "mark":
                out.append(run)
                continue
            n = len(run)
            k = max(1, int(n * CJK_RATES[script] + 0.5))
            out.extend(run[i * n // k : (i + 1) * n // k] for i in range(k))
    return out


def tokenize(text: str) -> list[int]:
    crc = zlib.crc32
    return [crc(w.encode()) for w in pieces(text)]


UNK_ID = 0
_OWN_WORD_IDS = dict(zip(VOCAB[:VOCAB_SIZE], VOCAB_IDS[:VOCAB_SIZE], strict=True))


@dataclass(frozen=True)
class Tokenizer:
    """How the served model turns a prompt into token ids.

    ``words`` (the default): every word is its own token (CRC-32), so distinct words are distinct
    tokens; CJK text is cut into pieces at Qwen2.5's rate (:func:`pieces`). ``wordlevel``: the tokenizer
    of the random-weight test models that real vLLM served on the H200 (``../shared/gpu/mkmodels.py``): a
    word-level vocabulary of ``w3`` ... ``w<vocab_size - 1>``, every other word ``<unk>`` (id 0), and a chat
    template ``"{role} {content} "`` per message followed by ``assistant`` (one more ``<unk>``). Under it the
    bench's English prompts are runs of ``<unk>``, so any prompt is a prefix of every longer one and vLLM's
    prefix cache hits most of it. The sim's own answer words (``tok<k>``) keep their ids: they stand for the
    noise words (``w<k>``) that the real random-weight models wrote, which are in the vocabulary.
    """

    kind: str = "words"
    vocab_size: int = 151936

    def pieces(self, text: str) -> list[str]:
        """The text of each token :meth:`encode` gives (a word-level vocabulary's are the words)."""
        return pieces(text) if self.kind == "words" else text.split()

    def encode(self, text: str) -> list[int]:
        if self.kind == "words":
            return tokenize(text)
        own, size = _OWN_WORD_IDS, self.vocab_size
        return [own.get(w, _wordlevel_id(w, size)) for w in text.split()]

    def encode_chat(self, text: str) -> list[int]:
        """``text`` is :func:`chat_text`; the word-level template appends its generation prompt."""
        ids = self.encode(text)
        return [*ids, UNK_ID] if self.kind == "wordlevel" else ids


WORDS_TOKENIZER = Tokenizer()  # the default (frozen)


def tokenizer_for(spec: TokenizerSpec) -> Tokenizer:
    """The tokenizer a profile's ``tokenizer`` section names."""
    return WORDS_TOKENIZER if spec == TokenizerSpec() else Tokenizer(spec.kind, spec.vocab_size)


def _wordlevel_id(word: str, vocab_size: int) -> int:
    if len(word) > 1 and word[0] == "w" and word[1:].isdigit() and word[1:].isascii():
        n = int(word[1:])
        if 3 <= n < vocab_size and word[1] != "0":  # the vocabulary spells "w12", never "w012"
            return n
    return UNK_ID


def chat_text(messages: Iterable[object]) -> str:
    """The text the sim tokenizes for a chat: each message's role, its content, and the name and arguments of
    each tool call it made (a tool result is a message of role ``tool``)."""
    parts: list[str] = []
    for msg in messages:
        if not isinstance(msg, dict):
            raise ValueError("each message must be an object")
        role = msg.get("role")
        if not isinstance(role, str):
            raise ValueError("each message needs a string 'role'")
        parts.append(role)
        content = msg.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    parts.append(part["text"])
        elif content is not None:
            raise ValueError("message 'content' must be a string or a list of parts")
        calls = msg.get("tool_calls")  # an assistant turn that called tools: the template renders the calls
        for call in calls if isinstance(calls, list) else ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                parts += [str(fn.get("name", "")), str(fn.get("arguments", ""))]
    return " ".join(parts)


def _unit(*key: object) -> float:
    """A uniform draw in (0, 1) fixed by ``key``."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2.0**64


def p_correct(quality: float, difficulty: float) -> float:
    return 1.0 / (1.0 + math.exp(-CORRECTNESS_SLOPE * (quality - difficulty)))


@dataclass(frozen=True)
class Answer:
    """What the model 'would say': its natural length, its words and its verdict marker."""

    natural_tokens: int  # tokens before EOS, marker included
    word_start: int
    marker: str | None


def word_index(start: int, i: int) -> int:
    """Vocabulary index of generated token ``i`` of an answer whose words start at ``start``."""
    return (start + i * _STRIDE) % VOCAB_SIZE


def draw_answer(
    seed: int,
    model: str,
    prompt: str,
    quality: float,
    output_tokens: int | None,
    difficulty: float | None,
) -> Answer:
    """The answer to ``prompt`` under ``seed``; ``output_tokens``/``difficulty`` come from ``sim``."""
    if output_tokens is None:
        z = NormalDist().inv_cdf(_unit(seed, model, prompt, "length"))
        output_tokens = max(1, round(DEFAULT_MEDIAN_TOKENS * math.exp(DEFAULT_SIGMA * z)))
    marker = None
    if difficulty is not None:
        ok = _unit(seed, model, prompt, difficulty, "verdict") < p_correct(quality, difficulty)
        marker = CORRECT if ok else WRONG
    start = int(_unit(seed, model, prompt, "words") * VOCAB_SIZE)
    return Answer(natural_tokens=output_tokens, word_start=start, marker=marker)


def render(indices: Sequence[int]) -> str:
    return " ".join(VOCAB[k] for k in indices)
