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
            "models": {"small-1B": {"correct": small, "output_tokens": 400 + 300 * hard + rng.randint(0, 40)},
                       "big-10B": {"correct": big, "output_tokens": 200 + rng.randint(0, 40)}},
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
    assert held["auc"]["small-1B"] > 0.8 and held["auc"]["big-10B"] > 0.7 and held["brier"]["small-1B"] < 0.15, held
    assert held["length_tau"]["small-1B"] > 0.4 and held["length_mape"]["big-10B"] < 0.3
    assert main(["predictor", "eval", "--dataset", str(new), "--model", str(model), "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)["scores"]
    assert scores["prompts"] == 150 and scores["auc"]["small-1B"] > 0.8 and scores["length_mape"]["small-1B"] < 0.3
    # routing on it: the small model where no hard word is, the big one elsewhere
    f = scores["frontier"]
    big, small = f["single"]["big-10B"], f["single"]["small-1B"]
    assert f["oracle"]["success"] >= big["success"] > small["success"]
    assert f["router_at"]["big-10B"] >= big["success"] - 0.01  # (the oracle is no better here: nothing to recover)
    assert f["reaches_best"]["share_of_its_cost"] < 0.95  # as right as the big model alone, for less
    costs = [p["cost"] for p in f["router"]]
    assert costs == sorted(costs) and f["router"][0]["success"] < f["router"][-1]["success"]  # dearer, better
    # the untrained prior knows nothing of the words
    assert main(["predictor", "eval", "--dataset", str(new), "--model", "prior", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scores"]["auc"]["small-1B"] in (None, 0.5)
    assert main(["predictor", "eval", "--dataset", str(new), "--model", str(model)]) == 0
    assert "auc" in capsys.readouterr().out  # a table a person reads
    assert main(["predictor", "train", "--dataset", str(train), "--out", str(model), "--folds", "1"]) == 2
    assert "--folds: must be 0 or from 2" in capsys.readouterr().err
