"""`chimera predictor collect`: the bench's workloads through a gateway that logs features, as one training log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from predictor.dataset import read_log, read_logs

ROOT = Path(__file__).resolve().parents[2]


def _chimera(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "router.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_collect_writes_one_log_of_every_run_that_the_predictor_trains_on(tmp_path: Path) -> None:
    log, model = tmp_path / "train.jsonl", tmp_path / "model.pkl"
    # quickstart.yaml has no gateway.predictor: collect adds a model-less one, so the features are logged
    proc = _chimera("predictor", "collect", "--config", str(ROOT / "examples" / "quickstart.yaml"), "--workload",
                    "mixed", "--rate", "4,8", "--duration", "1", "--warmup", "0", "--speedup", "25", "--drain", "15",
                    "--out", str(log))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{log}:" in proc.stdout and "from 2 runs" in proc.stdout
    records, feedback = read_log(log)
    assert records and len(feedback) == len(records)  # a verdict for every answer
    assert {r["policy"] for r in records} == {"round_robin"} and len({r["backend"] for r in records}) == 2
    # both runs replay seed 1's workflows: each run's keep ids of their own
    runs = {r["workflow_id"].rpartition("@")[2] for r in records}
    assert runs == {"round_robin-rate4-s1", "round_robin-rate8-s1"}
    assert {r["workflow_id"] for r in records} >= {f"s1-mixed-0@{run}" for run in runs}
    samples = read_logs([log])
    assert len(samples) == len(records)  # every request has the features a sample needs
    assert (tmp_path / "train.jsonl.runs" / "results.json").exists()
    trained = _chimera("predictor", "train", "--log", str(log), "--out", str(model))
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert model.stat().st_size > 0


def test_collect_refuses_bad_arguments_in_one_line(tmp_path: Path) -> None:
    cfg, log = str(ROOT / "examples" / "quickstart.yaml"), str(tmp_path / "x.jsonl")
    for args in (("--config", cfg, "--out", str(tmp_path)), ("--config", cfg, "--out", log, "--rate", "0"),
                 ("--config", cfg, "--out", log, "--workload", "nope"), ("--out", log)):  # fmt: skip
        proc = _chimera("predictor", "collect", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written
