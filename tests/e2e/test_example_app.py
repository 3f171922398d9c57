"""examples/multi_agent_app.py, run as its docstring says, against `chimera serve` on
examples/multi-agent.yaml (its simulated workers; ports moved, time sped up)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from backends.listen import free_port, wait_ready
from tests.conftest import interrupt

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_example_app_runs_its_agents_through_the_gateway(tmp_path: Path) -> None:
    gw, w1, w2 = free_port(), free_port(), free_port()
    text = (ROOT / "examples" / "multi-agent.yaml").read_text()
    text = text.replace("port: 8090", f"port: {gw}").replace("127.0.0.1:8091", f"127.0.0.1:{w1}")
    text = text.replace("127.0.0.1:8092", f"127.0.0.1:{w2}").replace("speedup: 1.0", "speedup: 10.0")
    cfg = tmp_path / "multi-agent.yaml"
    cfg.write_text(text)
    env = {**os.environ, "PLANNER_KEY": "pk-test", "CODER_KEY": "ck-test", "REVIEWER_KEY": "rk-test",
           "CHIMERA_URL": f"http://127.0.0.1:{gw}/v1"}  # fmt: skip
    serve = subprocess.Popen([sys.executable, "-m", "router.cli", "serve", "--config", str(cfg)], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_ready(f"http://127.0.0.1:{gw}/ready", 40, proc=serve)
        app = [sys.executable, str(ROOT / "examples" / "multi_agent_app.py")]
        run = subprocess.run([*app, "--sim", "a todo list"], env=env, capture_output=True, text=True, timeout=60)
        bad_key = subprocess.run([*app, "x"], env={**env, "CODER_KEY": "nope", "PLANNER_KEY": "nope"},
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        interrupt(serve)
    lines = run.stdout.splitlines()
    assert run.returncode in (0, 1), run.stderr  # approved, or not within its rounds: both a finished run
    steps = [ln.split("]")[0].strip("[ ") for ln in lines if ln.startswith("[")]
    assert steps[:3] == ["planner", "coder", "reviewer"] and len(steps) % 2 == 1
    workers = {ln.split("]", 1)[1].split()[0] for ln in lines if ln.startswith("[")}
    assert workers and workers <= {"small-0", "large-0"}  # each step's X-Chimera-Backend
    assert lines[-1].startswith(("approved after", "not approved after"))
    assert (run.returncode == 0) == lines[-1].startswith("approved")
    assert bad_key.returncode == 2 and "401" in bad_key.stderr and "Traceback" not in bad_key.stderr
