"""The code-quality gates run with the suite, so `pytest` alone tells whether main is green."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ruff_clean() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-4000:]


@pytest.mark.slow
def test_mypy_strict_on_packages() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "router", "backends", "predictor", "chimera_bench"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
