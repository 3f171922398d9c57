"""Outcome files: how each model answered each prompt — what ``chimera predictor train --dataset`` learns answer
quality and length from, and ``chimera predictor eval --dataset`` judges them on.

JSON lines, one prompt each (``docs/predictor.md``, "Routing on real answers", is the user's reference):

``id``        a string, unique across the files read together;
``task``      a string naming the prompt's task (``math``, ``code-review``): prompts are grouped by it;
``prompt``    the user message, as a string;
``models``    an object: per model name, ``{"correct": bool}`` or ``{"score": 0..1}``, and ``"output_tokens"`` (how
              long that model's answer was, an integer >= 1);
``prompt_tokens``, and any other field, are read where known and otherwise ignored.

A malformed line is one ``file:line: key: message`` error, never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Answer:
    score: float  # 1.0 right, 0.0 wrong, or a grade in between
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """One prompt and every model's answer to it."""

    id: str
    task: str
    prompt: str
    answers: Mapping[str, Answer]
    prompt_tokens: int | None = None


def read_outcomes(paths: Sequence[str | Path]) -> list[Outcome]:
    """Every prompt of ``paths``, in order. Raises ConfigError naming the file, line and key at fault."""
    out: list[Outcome] = []
    seen: dict[str, str] = {}
    for path in paths:
        for line_no, o in _read(Path(path)):
            if o.id in seen:
                raise ConfigError(f"prompt id {o.id!r} is also in {seen[o.id]}", file=str(path), line=line_no,
                                  key="id")  # fmt: skip
            seen[o.id] = f"{path}:{line_no}"
            out.append(o)
    if not out:
        raise ConfigError("no prompts in the outcome files", key="--dataset")
    return out


def _read(path: Path) -> Iterator[tuple[int, Outcome]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read it: {exc.strerror or exc}", file=str(path)) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text: {exc.reason}", file=str(path)) from exc
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield n, _outcome(line, str(path), n)


def _outcome(line: str, file: str, n: int) -> Outcome:
    def bad(key: str, message: str) -> ConfigError:
        return ConfigError(message, file=file, line=n, key=key)

    try:
        row: Any = json.loads(line)
    except ValueError as exc:
        raise bad("", f"not a JSON object: {exc}") from None
    if not isinstance(row, dict):
        raise bad("", "not a JSON object")
    for key in ("id", "task", "prompt"):
        if not isinstance(row.get(key), str) or not row[key]:
            raise bad(key, "a non-empty string is required")
    models = row.get("models")
    if not isinstance(models, dict) or not models:
        raise bad("models", "an object of model name: {correct or score, output_tokens} is required")
    answers = {}
    for name, a in models.items():
        where = f"models.{name}"
        if not isinstance(a, dict):
            raise bad(where, "an object {correct or score, output_tokens} is required")
        if isinstance(a.get("correct"), bool):
            score = 1.0 if a["correct"] else 0.0
        elif isinstance(a.get("score"), int | float) and not isinstance(a["score"], bool) and 0 <= a["score"] <= 1:
            score = float(a["score"])
        else:
            raise bad(where, "needs correct (a boolean) or score (a number in [0, 1])")
        tokens = a.get("output_tokens")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise bad(f"{where}.output_tokens", "an integer >= 1 is required")
        answers[name] = Answer(score, tokens)
    pt = row.get("prompt_tokens")
    prompt_tokens = pt if isinstance(pt, int) and not isinstance(pt, bool) and pt > 0 else None
    return Outcome(row["id"], row["task"], row["prompt"], answers, prompt_tokens)
