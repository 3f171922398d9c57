"""The prompt-token estimate: characters counted by kind, priced at per-kind rates learned per served model.

A BPE tokenizer spends its tokens differently on different text: an English word is about one token, a Han
character about 0.7, a digit one (Qwen, Llama 3), a run of punctuation a little less than one a character.
So the gateway counts a prompt's characters by kind (:data:`KINDS`) in one pass over its UTF-8 bytes (mapped to
byte classes, whose adjacent pairs are counted in one histogram: a multi-byte character's lead byte names its
script, a letter after a non-letter starts a word) and prices each kind at its own rate, plus the chat template's
tokens per request, per message, for tools and for a default system prompt. No tokenizer runs per request.

The rates start at :data:`PRIOR_RATES`, fitted to Qwen2.5's BPE tokenizer on English prose, technical
Markdown, Python, Chinese, Japanese and Korean (2-5 % from its counts on average on held-out prompts of each),
and are calibrated per served model on the ``usage.prompt_tokens`` its workers report (:class:`PromptLengths`):
an exponentially weighted least squares on relative error, shrunk towards the prior, with non-negative rates.
A model whose workers never report usage keeps the prior.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

__all__ = ["KINDS", "PRIOR_RATES", "PromptCounts", "PromptLengths", "RateFit", "char_counts", "prompt_counts"]

# Template terms (chat and Responses requests; 0 for a completion's raw prompt), then character kinds.
KINDS = (
    "requests",  # the generation prompt ("<|im_start|>assistant\n"), a default system prompt
    "messages",  # role markers and separators around each message
    "tools",  # 1 where tools are offered: the template's preamble around their schemas
    "no_system",  # 1 where a chat opens without a system message: some templates add a default one
    "words",  # runs of ASCII letters (a common word is one token; a rare or long one more, see letters)
    "letters",  # ASCII letters
    "digits",  # ASCII digits (one token each in Qwen and Llama 3; tiktoken groups three)
    "punct",  # ASCII punctuation and symbols
    "gaps",  # runs of whitespace before more text: a word-level tokenizer's words (BPE's space joins the next word)
    "newlines",
    "han",  # CJK ideographs (U+4000-U+9FFF)
    "kana",  # hiragana, katakana (and the rest of U+3040-U+3FFF)
    "hangul",  # Hangul syllables (U+A000-U+DFFF)
    "cjk_punct",  # CJK and full-width punctuation (U+3000-U+303F, U+E000-U+FFFF)
    "other",  # any other non-ASCII character: accented Latin, Cyrillic, Greek, Indic, symbols, emoji
)
N_KINDS = len(KINDS)
_K = {name: i for i, name in enumerate(KINDS)}
REQUESTS, MESSAGES, TOOLS, NO_SYSTEM = _K["requests"], _K["messages"], _K["tools"], _K["no_system"]
_WORDS, _GAPS, _KANA, _CJK_PUNCT = _K["words"], _K["gaps"], _K["kana"], _K["cjk_punct"]

# Qwen2.5's tokens per unit. Its chat template: 5 tokens a message (<|im_start|>, the role, "\n", <|im_end|>,
# "\n"), 3 for the generation prompt, 88 for the tool preamble, 21 for the system message it adds where a chat
# has none ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant."). Characters: fitted (least
# squares on relative error, non-negative) to its counts on 390 prompts of 100-5,000 characters of English prose
# and Markdown, Python, Chinese, Japanese, Korean and mixes; a digit and a CJK punctuation mark are one token
# each, as it cuts them.
PRIOR_RATES = np.array([3.0, 5.0, 88.0, 21.0, 0.37, 0.05, 1.0, 0.72, 0.47, 0.72, 0.68, 0.56, 0.65, 1.0, 0.35])
# How firmly the prior holds: as firmly as PRIOR_REQUESTS requests of TYPICAL_TOKENS tokens, each holding this
# many units of each kind, would hold it (where a kind is present at all).
TYPICAL_COUNTS = np.array([1, 4, 1, 1, 150, 700, 20, 100, 150, 20, 400, 300, 300, 40, 20], dtype=float)
TYPICAL_TOKENS, PRIOR_REQUESTS = 500.0, 1.0


# Each UTF-8 byte's class (bytes.translate maps a text to them in one pass); a multi-byte character is its lead
# byte's class followed by continuation bytes of class _NONE (or _CONT80, the one byte that tells the CJK
# punctuation E3 80 xx from the kana E3 81-83 xx).
_NONE, _LETTER, _DIGIT, _PUNCT, _SPACE, _NEWLINE, _HAN, _KANA_LEAD, _HANGUL, _WIDE_PUNCT, _OTHER, _CONT80 = range(12)
_N_CLASSES = 12
_KIND_OF_CLASS = {_LETTER: "letters", _DIGIT: "digits", _PUNCT: "punct", _NEWLINE: "newlines", _HAN: "han",
                  _KANA_LEAD: "kana", _HANGUL: "hangul", _WIDE_PUNCT: "cjk_punct", _OTHER: "other"}  # fmt: skip


def _class_of(b: int) -> int:
    if b < 128:
        c = chr(b)
        if c.isalpha():
            return _LETTER
        if c.isdigit():
            return _DIGIT
        if c in "\n\r":
            return _NEWLINE
        return _SPACE if c.isspace() else _PUNCT if 33 <= b <= 126 else _NONE
    if b == 0x80:
        return _CONT80
    if b < 0xC0:
        return _NONE  # other continuation bytes
    if b == 0xE3:
        return _KANA_LEAD  # U+3000-U+3FFF
    if 0xE4 <= b <= 0xE9:
        return _HAN  # U+4000-U+9FFF
    if 0xEA <= b <= 0xED:
        return _HANGUL  # U+A000-U+DFFF
    return _WIDE_PUNCT if b in (0xEE, 0xEF) else _OTHER  # U+E000-U+FFFF; 2- and 4-byte leads, U+0800-U+2FFF


def _pair_kinds() -> tuple[np.ndarray, np.ndarray]:
    """What each pair of adjacent byte classes adds to the counts (the second byte's kind, a word's start, a
    gap's end, a CJK mark), and what the first byte of a text adds: one histogram of pairs gives them all."""
    unit = np.zeros((_N_CLASSES, N_KINDS))
    for cls, kind in _KIND_OF_CLASS.items():
        unit[cls, _K[kind]] = 1.0
    pairs = np.zeros((_N_CLASSES * _N_CLASSES, N_KINDS))
    blank = (_SPACE, _NEWLINE)
    for a in range(_N_CLASSES):
        for b in range(_N_CLASSES):
            row = pairs[a * _N_CLASSES + b]
            row += unit[b]
            if b == _LETTER and a != _LETTER:
                row[_WORDS] += 1.0
            if a in blank and b not in blank:
                row[_GAPS] += 1.0
            if a == _KANA_LEAD and b == _CONT80:  # E3 80 xx: 、。「」 and the rest of U+3000-U+303F
                row[_KANA] -= 1.0
                row[_CJK_PUNCT] += 1.0
    first = unit.copy()
    first[_LETTER, _WORDS] += 1.0
    return pairs, first


_CLASSES = bytes(_class_of(b) for b in range(256))
_PAIR_KINDS, _FIRST_KINDS = _pair_kinds()


def char_counts(text: str) -> np.ndarray:
    """The characters of ``text`` by kind (a float vector over :data:`KINDS`, the template terms 0): its UTF-8
    bytes mapped to classes, the histogram of adjacent pairs of classes, one product."""
    classes = np.frombuffer(text.encode("utf-8", "surrogatepass").translate(_CLASSES), np.uint8)
    pairs = classes[:-1] * np.uint8(_N_CLASSES)  # < 144: a pair's code fits a byte
    pairs += classes[1:]
    counts: np.ndarray = np.bincount(pairs, minlength=_N_CLASSES * _N_CLASSES) @ _PAIR_KINDS
    counts += _FIRST_KINDS[classes[0]]
    return counts


@dataclass(frozen=True, slots=True)
class PromptCounts:
    """What a request's prompt is made of: ``kinds`` (over :data:`KINDS`) and ``exact`` tokens (a completion's
    prompt given as token ids)."""

    kinds: np.ndarray
    exact: int = 0

    def tokens(self, rates: np.ndarray = PRIOR_RATES) -> int:
        return self.exact + max(0, round(float(self.kinds @ rates)))


def prompt_counts(
    text: str, messages: int = 0, tools: bool = False, system: bool = True, exact: int = 0
) -> PromptCounts:
    """``text`` (all the prompt's text, in one string) and its template terms: ``messages`` > 0 for a chat or
    Responses request (the generation prompt counts once), ``tools`` where it offers tools, ``system`` where
    it opens with a system message."""
    kinds = char_counts(text) if text else np.zeros(N_KINDS)
    if messages:
        kinds[REQUESTS], kinds[MESSAGES] = 1.0, float(messages)
        kinds[NO_SYSTEM] = 0.0 if system else 1.0
    if tools:
        kinds[TOOLS] = 1.0
    return PromptCounts(kinds, exact)


class RateFit:
    """One model's rates: exponentially weighted ridge regression towards the prior on relative error, i.e.
    minimise ``sum_i decay**age_i * ((x_i . r - y_i) / y_i)**2 + sum_k precision_k * (r_k - prior_k)**2`` over
    ``r >= 0``. Kept as its sufficient statistics (a 15 x 15 matrix and a vector), so a refit is one small
    solve and nothing grows with the traffic. An observation only keeps its row: the rows since the last
    refit are folded into the statistics there, in one product. A kind never seen keeps its prior rate exactly."""

    def __init__(self, prior: np.ndarray = PRIOR_RATES, precision: np.ndarray | None = None,
                 decay: float = 0.998) -> None:  # fmt: skip
        self.prior, self.decay = prior, decay
        self.precision = PRIOR_REQUESTS * (TYPICAL_COUNTS / TYPICAL_TOKENS) ** 2 if precision is None else precision
        self._gram = np.zeros((N_KINDS, N_KINDS))
        self._moment = np.zeros(N_KINDS)
        self._rows: list[np.ndarray] = []  # observed since the last fold
        self.rates_ = prior
        self.observed_ = 0

    def observe(self, kinds: np.ndarray, tokens: float) -> None:
        self._rows.append(kinds / tokens)  # a row of the relative-error problem (its target is 1)
        self.observed_ += 1

    def _fold(self) -> None:
        if not self._rows:
            return
        rows = np.array(self._rows)
        self._rows = []
        weights = self.decay ** np.arange(len(rows) - 1, -1, -1, dtype=float)  # the newest row weighs 1
        shrink = self.decay ** len(rows)
        self._gram *= shrink
        self._gram += (rows.T * weights) @ rows
        self._moment *= shrink
        self._moment += weights @ rows

    def refit(self) -> np.ndarray:
        """Solve for the rates (the normal equations, variables held at 0 while the solution would make them
        negative) and keep them in ``rates_``, swapped in one store."""
        self._fold()
        a = self._gram + np.diag(self.precision)
        b = self._moment + self.precision * self.prior
        free = np.ones(N_KINDS, dtype=bool)
        rates = np.zeros(N_KINDS)
        for _ in range(N_KINDS):  # the prior's positive rates make more than one round rare
            rates[:] = 0.0
            rates[free] = np.linalg.solve(a[np.ix_(free, free)], b[free])
            negative = rates < 0.0
            if not negative.any():
                break
            free &= ~negative
        self.rates_ = np.maximum(rates, 0.0)
        return self.rates_


MAX_MODELS = 256  # models calibrated per gateway; beyond, the others keep the prior (a bound on memory)
# A count further than this from the current estimate (either way) is not learned from: more likely a bug, or a
# tokenizer of whole words (a word-level test model counts a Chinese sentence as one token), than a BPE's count.
MAX_RATIO, SLACK_TOKENS = 4.0, 16
# after a model's first 16 observations, refit every 8 of them up to its 256th, then every 64
_REFIT_EVERY = ((256, 8), (sys.maxsize, 64))


class PromptLengths:
    """The per-model calibration of the prompt estimate, held by one gateway process (its replicas each
    learn their own, from the answers they relay). Estimates and observations run on the event loop: an
    observation keeps one row, a refit folds the rows in and solves a 15 x 15 system, inline, every few
    observations (ever fewer as the model's count grows: its rates have settled by then), and a model's
    ``rates_`` is replaced, never changed in place, so a reader on any thread sees one whole vector."""

    def __init__(self, prior: np.ndarray = PRIOR_RATES) -> None:
        self.prior = prior
        self._fits: dict[str, RateFit] = {}

    def estimate(self, counts: PromptCounts, models: tuple[str, ...]) -> int:
        """The prompt's tokens under the rates of each model it may go to: the largest (what KV admission and
        the TTFT prediction must allow for wherever it lands)."""
        fits = self._fits
        if not fits:
            return counts.tokens(self.prior)
        return max((counts.tokens(fits[m].rates_ if m in fits else self.prior) for m in models), default=0)

    def observe(self, model: str | None, counts: PromptCounts | None, prompt_tokens: int | None) -> None:
        """Learn from a worker's ``usage.prompt_tokens`` for a prompt of ``counts`` served by ``model``."""
        if model is None or counts is None or prompt_tokens is None:
            return
        tokens = prompt_tokens - counts.exact
        if tokens <= 0:
            return
        fit = self._fits.get(model)
        expected = float(counts.kinds @ (self.prior if fit is None else fit.rates_))
        if not expected / MAX_RATIO - SLACK_TOKENS <= tokens <= expected * MAX_RATIO + SLACK_TOKENS:
            return
        if fit is None:
            if len(self._fits) >= MAX_MODELS:
                return
            fit = self._fits[model] = RateFit(self.prior)
        fit.observe(counts.kinds, float(tokens))
        n = fit.observed_
        if n <= 16 or n % next(every for upto, every in _REFIT_EVERY if n <= upto) == 0:
            fit.refit()

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Each calibrated model's rates by kind."""
        return {m: dict(zip(KINDS, (round(float(r), 4) for r in f.rates_), strict=True)) for m, f in self._fits.items()}
