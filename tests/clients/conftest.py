"""Clients nobody here wrote, against `chimera serve` on examples/multi-agent.yaml (its three agents and their
keys, its two simulated workers; ports moved, time sped up, the request log in a temporary folder).

A client whose dependencies clash with the dev extra's (CrewAI needs openai < 3, the OpenAI Agents SDK
openai >= 3) or that is heavy (guidellm needs torch) runs from an environment of its own, ``.venv-<name>``
at the repository's root, made from ``envs/<name>.txt`` the first time (about a minute from a package index)
and reused while that file is unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backends.listen import free_port, wait_ready
from router.requestlog import FLUSH_INTERVAL_S
from tests.conftest import interrupt

ROOT = Path(__file__).resolve().parents[2]
ENVS = Path(__file__).resolve().parent / "envs"
KEYS = {"PLANNER_KEY": "pk-clients", "CODER_KEY": "ck-clients", "REVIEWER_KEY": "rk-clients"}


@dataclass
class Gateway:
    url: str
    log: Path
    env: dict[str, str]

    def run(self, argv: Sequence[str], timeout_s: float = 120, cwd: Path | None = None) -> tuple[
            subprocess.CompletedProcess[str], list[Any]]:  # fmt: skip
        """Run a client against the gateway; its output, and the request-log rows it caused."""
        seen = len(self.rows())
        proc = subprocess.run(list(argv), env=self.env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
        time.sleep(2 * FLUSH_INTERVAL_S + 0.2)  # the gateway writes its log twice a second
        return proc, self.rows()[seen:]

    def rows(self) -> list[Any]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("clients")
    gw, w1, w2 = free_port(), free_port(), free_port()
    text = (ROOT / "examples" / "multi-agent.yaml").read_text()
    text = text.replace("port: 8090", f"port: {gw}").replace("127.0.0.1:8091", f"127.0.0.1:{w1}")
    text = text.replace("127.0.0.1:8092", f"127.0.0.1:{w2}").replace("speedup: 1.0", "speedup: 10.0")
    text = text.replace("logs/multi-agent.jsonl", str(tmp / "requests.jsonl"))
    cfg = tmp / "multi-agent.yaml"
    cfg.write_text(text)
    url = f"http://127.0.0.1:{gw}"
    env = {**os.environ, **KEYS, "CHIMERA_URL": url + "/v1"}
    serve = subprocess.Popen([sys.executable, "-m", "router.cli", "serve", "--config", str(cfg)], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_ready(url + "/ready", 40, proc=serve)
        yield Gateway(url, tmp / "requests.jsonl", env)
    finally:
        interrupt(serve)


def tool_env(name: str) -> Path:
    """The ``bin`` folder of the client's own environment, made from ``envs/<name>.txt`` if it is missing or
    was made from another version of that file."""
    venv = ROOT / f".venv-{name}"
    req = ENVS / f"{name}.txt"
    stamp = venv / "requirements.txt"
    if not (stamp.exists() and stamp.read_text() == req.read_text()):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(req)],
                       check=True, timeout=800, stdout=subprocess.DEVNULL)  # fmt: skip
        stamp.write_text(req.read_text())
    return venv / "bin"
