"""The code-quality gates run with the suite, so `pytest` alone tells whether main is green."""

from __future__ import annotations

import os
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
    # mypy's incremental cache in the user's cache, shared by every clone: it re-checks what changed (by content),
    # so a fresh clone pays for its own changes, not for all 126 modules (15 s of CPU)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chimera-router" / "mypy"
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache), "router", "backends", "predictor", "chimera_bench"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
