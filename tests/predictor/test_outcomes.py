"""`chimera predictor train|eval --dataset`: outcome files read (or refused line by line), quality and length learned
from them, and judged on prompts held out of the fit. The outcomes here are drawn so that a word decides who
answers right: the real ones are in ../shared/data/ladder (docs/predictor.md has their figures and the command)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from predictor.outcomes import read_outcomes
from router.cli import main
from router.core.errors import ConfigError

WORDS = [f"w{i}" for i in range(200)]
HARD = {"w1", "w2", "w3", "w4", "w5", "w6"}  # a prompt holding one is beyond the small model


def write_outcomes(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        words = rng.sample(WORDS, 12)
        hard = len(HARD & set(words))
        small, big = hard == 0, hard < 2  # the big model fails only where two hard words meet
        if rng.random() < 0.05:
            small = not small  # label noise, as real verdicts have
        task = "math" if i % 2 else "code"
        lines.append(json.dumps({
            "id": f"{seed}-{i}", "task": task, "prompt": " ".join(words),
            "models": {"small": {"correct": small, "output_tokens": 400 + 300 * hard + rng.randint(0, 40)},
                       "big": {"correct": big, "output_tokens": 200 + rng.randint(0, 40)}},
        }))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_outcome_files_are_refused_line_by_line(tmp_path: Path) -> None:
    good = '{"id": "a", "task": "t", "prompt": "p", "models": {"m": {"correct": true, "output_tokens": 5}}}'
    cases = {
        "not json": ":2: not a JSON object",
        '{"id": "b", "task": "t", "prompt": "", "models": {}}': ":2: prompt: a non-empty string is required",
        '{"id": "b", "task": "t", "prompt": "p", "models": {"m": {"output_tokens": 5}}}': ":2: models.m: needs correct",
        '{"id": "b", "task": "t", "prompt": "p", "models": {"m": {"score": 0.5, "output_tokens": 0}}}':
            ":2: models.m.output_tokens: an integer >= 1",
        good: ":2: id: prompt id 'a' is also in",
    }  # fmt: skip
    for line, said in cases.items():
        f = tmp_path / "o.jsonl"
        f.write_text(good + "\n" + line + "\n")
        with pytest.raises(ConfigError) as err:
            read_outcomes([f])
        assert said in str(err.value) and str(err.value).startswith(str(f)), str(err.value)
    f.write_text(good + "\n")
    (o,) = read_outcomes([f])
    assert o.answers["m"].score == 1.0 and o.answers["m"].output_tokens == 5


def test_quality_and_length_learned_from_outcomes_hold_on_new_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train, new = write_outcomes(tmp_path / "train.jsonl", 400, 1), write_outcomes(tmp_path / "new.jsonl", 150, 2)
    model = tmp_path / "p.pkl"
    args = ["predictor", "train", "--dataset", str(train), "--out", str(model), "--folds", "3", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["trained_on"] == {"prompts": 400, "answers": 800, "tasks": ["code", "math"]}
    held = report["held_out"]
    assert held["auc"]["small"] > 0.8 and held["auc"]["big"] > 0.7 and held["brier"]["small"] < 0.15, held
    assert held["length_tau"]["small"] > 0.4 and held["length_mape"]["big"] < 0.3
    assert main(["predictor", "eval", "--dataset", str(new), "--model", str(model), "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)["scores"]
    assert scores["prompts"] == 150 and scores["auc"]["small"] > 0.8 and scores["length_mape"]["small"] < 0.3
    # the untrained prior knows nothing of the words
    assert main(["predictor", "eval", "--dataset", str(new), "--model", "prior", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scores"]["auc"]["small"] in (None, 0.5)
    assert main(["predictor", "eval", "--dataset", str(new), "--model", str(model)]) == 0
    assert "auc" in capsys.readouterr().out  # a table a person reads
    assert main(["predictor", "train", "--dataset", str(train), "--out", str(model), "--folds", "1"]) == 2
    assert "--folds: must be 0 or from 2" in capsys.readouterr().err
