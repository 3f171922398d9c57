"""scripts/predictor/cost_frontier.py: the Wilson interval and the pooled success it prints."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "predictor" / "cost_frontier.py"


@pytest.fixture(scope="module")
def frontier() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cost_frontier", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [(8, 10, 0.4902, 0.9433), (0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (81, 97, 0.7487, 0.8958)],
)
def test_wilson_matches_published_values(frontier: ModuleType, k: int, n: int, lo: float, hi: float) -> None:
    got = frontier.wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=5e-4)


def test_success_is_pooled_over_workflows_not_averaged_over_seeds(
    frontier: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(seed: int, success: float, workflows: int) -> dict[str, object]:
        return {"policy": "p", "config": {"rate": 2, "seed": seed}, "task_success": success, "workflows": workflows}

    frontier.pooled_success([run(1, 1.0, 30), run(2, 0.5, 10)])  # 35 of 40, where the seeds' mean is 75 %
    row = capsys.readouterr().out.splitlines()[-1]
    assert "| 2 | p | 40 | 87.5 % |" in row
