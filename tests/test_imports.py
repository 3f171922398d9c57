"""Every module imports on its own in a fresh interpreter: no import cycles, no import-time I/O.

"Fresh" as far as our code goes: each module is imported in a child forked from one interpreter per test process
that has imported the third-party libraries our packages use (numpy, scikit-learn, starlette, ...) and nothing of
ours, so a child pays for our module alone, not for scikit-learn again, 126 times. The child refuses network I/O
(a connect raises) before it imports the module.
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("router", "backends", "predictor", "chimera_bench")

# Reads module names on stdin (or FOLDER<tab>MODULE); for each, forks a child that refuses network I/O and imports
# it, and answers one JSON line: {"ok": true} or {"ok": false, "error": the traceback's end}.
SERVER = r"""
import importlib, json, os, socket, sys, traceback
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        pass
assert not [m for m in sys.modules if m.split(".")[0] in {"router", "backends", "predictor", "chimera_bench"}]
def _no_net(*a, **k):
    raise RuntimeError("network I/O at import time")
for line in sys.stdin:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        socket.socket.connect = _no_net
        where, _, module = line.strip().rpartition("\t")  # (a folder to import from, for this test's own check)
        if where:
            sys.path.insert(0, where)
        try:
            importlib.import_module(module)
            code = 0
        except BaseException:
            os.write(write, traceback.format_exc()[-2000:].encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as r:
        error = r.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    ok = os.waitstatus_to_exitcode(status) == 0
    print(json.dumps({"ok": ok, "error": error or f"exit status {os.waitstatus_to_exitcode(status)}"}), flush=True)
"""


def _modules() -> list[str]:
    names: list[str] = []
    for pkg in PACKAGES:
        names.append(pkg)
        for info in pkgutil.walk_packages([str(ROOT / pkg)], prefix=pkg + "."):
            names.append(info.name)
    return names


def _third_party() -> list[str]:
    """The top-level names our packages import (at any depth of a module) that are not ours."""
    found: set[str] = set()
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    found.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    found.add(node.module.split(".")[0])
    return sorted(found - {*PACKAGES, "__future__"})


@pytest.fixture(scope="module")
def importer() -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}  # no thread pools across the forks
    proc = subprocess.Popen([sys.executable, "-c", SERVER, *_third_party()], cwd=ROOT, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    with proc:  # (closes its pipes)
        yield proc
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.mark.parametrize("module", _modules())
def test_module_imports_alone(module: str, importer: subprocess.Popen[str]) -> None:
    assert importer.stdin is not None and importer.stdout is not None
    importer.stdin.write(module + "\n")
    importer.stdin.flush()
    answer = json.loads(importer.stdout.readline())
    assert answer["ok"], answer["error"]


def test_a_module_that_connects_at_import_fails(importer: subprocess.Popen[str], tmp_path: Path) -> None:
    """The check can fail: a module that opens a connection as it is imported, and one that cannot import."""
    assert importer.stdin is not None and importer.stdout is not None
    (tmp_path / "connects_at_import.py").write_text("import socket\nsocket.create_connection(('127.0.0.1', 9))\n")
    for line, said in ((f"{tmp_path}\tconnects_at_import", "network I/O at import time"),
                       ("router.no_such_module", "No module named")):  # fmt: skip
        importer.stdin.write(line + "\n")
        importer.stdin.flush()
        answer = json.loads(importer.stdout.readline())
        assert not answer["ok"] and said in answer["error"]
