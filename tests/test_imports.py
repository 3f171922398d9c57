"""Every module imports on its own in a fresh interpreter: no import cycles, no import-time I/O."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("router", "backends", "predictor", "chimera_bench")


def _modules() -> list[str]:
    names: list[str] = []
    for pkg in PACKAGES:
        names.append(pkg)
        for info in pkgutil.walk_packages([str(ROOT / pkg)], prefix=pkg + "."):
            names.append(info.name)
    return names


@pytest.mark.parametrize("module", _modules())
def test_module_imports_alone(module: str) -> None:
    code = (
        "import socket, sys\n"
        "def _no_net(*a, **k): raise RuntimeError('network I/O at import time')\n"
        "socket.socket.connect = _no_net\n"
        f"import {module}\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
