"""Clients nobody here wrote, against `chimera serve` on examples/multi-agent.yaml (its three agents and their
keys, its two simulated workers; ports moved, time sped up, the request log in a temporary folder).

A client whose dependencies clash with the dev extra's (CrewAI needs openai < 3, the OpenAI Agents SDK
openai >= 3) or that is heavy (guidellm needs torch) runs from an environment of its own, made from
``envs/<name>.txt`` the first time (30 to 45 s each from a package index) in the user's cache and reused while that
file is unchanged (:func:`env_dir`). A run that includes these tests starts building the missing ones in the
background as it starts (tests/conftest.py), so the builds overlap the other tests.
"""

from __future__ import annotations

import fcntl
import hashlib
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
    """The ``bin`` folder of the client's own environment (waiting for a build :func:`build_envs` began)."""
    return build_env(name) / "bin"


def env_dir(name: str) -> Path:
    """Where the environment of ``envs/<name>.txt`` lives: under the user's cache (``$XDG_CACHE_HOME``, else
    ``~/.cache``), named by a digest of that file and this Python, so every clone and worktree shares it and a
    changed file makes a new one."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chimera-router" / "test-envs"
    digest = hashlib.sha256(((ENVS / f"{name}.txt").read_text() + sys.version).encode()).hexdigest()[:12]
    return cache / f"{name}-{digest}"


def build_env(name: str) -> Path:
    """The environment of ``envs/<name>.txt``, made unless it was made whole before. One process at a time builds
    it (a lock file beside it); the others wait and find it made. ``--no-compile``: a client compiles only the
    modules it imports, not all of torch."""
    venv = env_dir(name)
    venv.parent.mkdir(parents=True, exist_ok=True)
    done = venv / "requirements.txt"  # written last: the environment is whole
    with open(venv.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", "-r",
                            str(ENVS / f"{name}.txt")], check=True, timeout=800, stdout=subprocess.DEVNULL)  # fmt: skip
            done.write_text((ENVS / f"{name}.txt").read_text())
    return venv


def build_envs() -> None:
    """Every client environment, one after the other (`python -m tests.clients.conftest`: what a test run starts in
    the background when it will run the clients' tests, so the builds overlap the other tests while taking one core
    of the two, not both)."""
    for path in sorted(ENVS.glob("*.txt")):
        build_env(path.stem)


if __name__ == "__main__":
    build_envs()
