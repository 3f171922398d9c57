"""A gateway for the framework apps: `chimera serve` on examples/multi-agent.yaml (its three agents and their
keys, its two simulated workers; ports moved, time sped up, the request log in a temporary folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backends.listen import free_port, wait_ready
from router.requestlog import FLUSH_INTERVAL_S
from tests.conftest import interrupt

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"PLANNER_KEY": "pk-frameworks", "CODER_KEY": "ck-frameworks", "REVIEWER_KEY": "rk-frameworks"}


@dataclass
class Gateway:
    url: str
    log: Path
    env: dict[str, str]

    def run(self, python: str, app: str, timeout_s: float = 90) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
        """Run one example app against the gateway; its output, and the request-log rows it caused."""
        seen = self.rows()
        proc = subprocess.run([python, str(ROOT / "examples" / "frameworks" / app), "a todo list"], env=self.env,
                              capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
        time.sleep(2 * FLUSH_INTERVAL_S + 0.2)  # the gateway writes its log twice a second
        return proc, self.rows()[len(seen) :]

    def rows(self) -> list[Any]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("frameworks")
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
