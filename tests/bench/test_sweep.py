"""`chimera bench … --costs`: the predictive policy per wrong_answer_s, the other policies once, one results.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from chimera_bench.sweep import pooled_success, wilson

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "router.cli", "bench", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_the_sweep_runs_predictive_once_per_cost_on_simulated_workers(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    proc = _bench("--config", str(ROOT / "examples" / "quickstart.yaml"), "--workload", "chat",
                  "--policies", "round_robin,predictive", "--costs", "0,6", "--rate", "10", "--duration", "1",
                  "--warmup", "0", "--speedup", "25", "--drain", "10", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    entries = json.loads((out / "results.json").read_text())
    assert [(e["policy"], e.get("wrong_answer_s")) for e in entries] == [
        ("round_robin", None), ("predictive_w0", 0.0), ("predictive_w6", 6.0)]  # fmt: skip
    assert all(e["requests"] > 0 and e["errors"] == 0 for e in entries)
    # each cost ran on a copy of the config with that cost, and the run records which
    for e, cost in zip(entries[1:], (0.0, 6.0), strict=True):
        cfg = yaml.safe_load(Path(e["config"]["file"]).read_text())
        assert cfg["gateway"]["policy_options"]["wrong_answer_s"] == cost and e["config"]["policy"] == "predictive"
    assert entries[0]["config"]["file"] == str(ROOT / "examples" / "quickstart.yaml")
    assert "| rate=10 | predictive_w6 |" in proc.stdout  # the pooled success table
    assert (out / "cost_frontier.png").stat().st_size > 1000


def test_a_sweep_without_the_predictive_policy_exits_2_before_running(tmp_path: Path) -> None:
    cfg = str(ROOT / "examples" / "quickstart.yaml")
    for args in (("--policies", "round_robin", "--costs", "1"), ("--policies", "predictive", "--costs", "nan"),
                 ("--policies", "predictive", "--costs", "1,1")):  # fmt: skip
        proc = _bench("--config", cfg, "--workload", "chat", "--rate", "1", *args, "--out", str(tmp_path / "x"))
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "--costs" in proc.stderr
    assert not (tmp_path / "x" / "results.json").exists()


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [(8, 10, 0.4902, 0.9433), (0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (81, 97, 0.7487, 0.8958)],
)
def test_wilson_matches_published_values(k: int, n: int, lo: float, hi: float) -> None:
    assert wilson(k, n) == pytest.approx((lo, hi), abs=5e-4)


def test_success_is_pooled_over_workflows_not_averaged_over_seeds() -> None:
    def run(seed: int, success: float, workflows: int) -> dict[str, object]:
        return {"policy": "p", "rate": 2.0, "seed": seed, "task_success": success, "workflows": workflows}

    rows = pooled_success([run(1, 1.0, 30), run(2, 0.5, 10)])  # 35 of 40, where the seeds' mean is 75 %
    assert rows[-1].startswith("| rate=2 | p | 40 | 87.5 % |")
