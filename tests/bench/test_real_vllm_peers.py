"""``scripts/real_vllm.py peers``: the runs of scripts/h200_peers.sh as one table and one file per workload."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import real_vllm


def _entry(policy: str, seed: int, wf_p50: float, success: float, share: dict[str, float]) -> dict:
    return {"policy": policy, "seed": seed, "workflow_e2e_ms": {"p50": wf_p50}, "workflows": 100,
            "task_success": success, "sla_attainment": 1.0, "tpot_ms": {"p50": 6.5}, "model_share": share}  # fmt: skip


def test_peers_names_each_cost_and_divides_by_the_peer_per_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    for seed, (peer, w6, w24) in enumerate(((4000.0, 5000.0, 8000.0), (4400.0, 4400.0, 5500.0)), 1):
        (d := tmp_path / f"mixed-w6-s{seed}").mkdir()
        (d / "real-mixed.json").write_text(json.dumps([
            _entry("vllm-router:cache_aware", seed, peer, 0.95, {"7b": 1.0}),
            _entry("predictive", seed, w6, 0.90, {"1.5b": 0.4, "7b": 0.6})]))  # fmt: skip
        (d := tmp_path / f"mixed-w24-s{seed}").mkdir()
        (d / "real-mixed.json").write_text(json.dumps([_entry("predictive", seed, w24, 0.93, {"7b": 1.0})]))
    (d := tmp_path / "chat-s1").mkdir()
    (d / "real-chat.json").write_text(json.dumps([_entry("predictive", 1, 900.0, 0.9, {"7b": 1.0})]))
    real_vllm.main(["peers", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    merged = json.loads((tmp_path / "real-mixed.json").read_text())
    assert sorted({e["policy"] for e in merged}) == ["predictive_w24", "predictive_w6", "vllm-router:cache_aware"]
    assert json.loads((tmp_path / "real-chat.json").read_text())[0]["policy"] == "predictive"  # one cost: its name
    rows = {line.split(" | ")[0]: line.split(" | ") for line in lines if " | " in line and ":" not in line[:8]}
    assert rows["predictive_w6"][2] == "0.80, 1.00" and rows["predictive_w24"][2] == "0.50, 0.80"
    assert rows["predictive_w6"][3] == "90.0" and rows["predictive_w6"][6] == "1.5b 40% / 7b 60%"
    assert lines[1].startswith("vllm-router:cache_aware | 4200 ± 283 | 1.00, 1.00")  # the peer first
