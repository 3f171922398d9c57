"""The tool that compares the sim with real vLLM (scripts/real_vllm.py); the profile fit's tests are
test_profiling_*.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPTS = Path(__file__).parents[2] / "scripts"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def real_vllm() -> ModuleType:
    return _load("real_vllm", SCRIPTS / "real_vllm.py")


def _entry(workload: str, policy: str, **counters: tuple[float, float]) -> dict[str, Any]:
    workers = {w: {"prefix_cache_queries": q, "prefix_cache_hits": h} for w, (q, h) in counters.items()}
    return {"workload": workload, "policy": policy, "requests": 1, "worker_counters": workers}


def test_real_counters_of_one_boot_are_taken_per_run(real_vllm: ModuleType) -> None:
    # results whose workers' counters count from one boot: chat 10 % hits, then a mixed run of 50 %, which the
    # cumulative counters show as 37 %
    runs = [_entry("mixed", "round_robin", a=(2000, 600), b=(1000, 500)),
            _entry("chat", "round_robin", a=(1000, 100), b=(0, 0))]  # fmt: skip
    own = real_vllm.per_run_counters(runs)
    assert real_vllm.hit_rate(runs[0]["worker_counters"]) == pytest.approx(1100 / 3000)
    assert real_vllm.hit_rate(own[("chat", "round_robin")]) == pytest.approx(0.1)
    assert real_vllm.hit_rate(own[("mixed", "round_robin")]) == pytest.approx(0.5)
    sim = [_entry("mixed", "round_robin", a=(2000, 1000))]  # a sim started for the run: its own counters
    rows = {r.split(" | ")[0]: r for r in real_vllm.table(runs, sim)[0][2:]}
    assert rows["| mixed"].endswith("| 50.0 % / 50.0 % |")


def test_counters_that_go_down_are_not_taken_for_one_boot(real_vllm: ModuleType) -> None:
    runs = [_entry("chat", "a", a=(1000, 100), b=(10, 0)), _entry("chat", "b", a=(900, 50), b=(500, 0))]
    with pytest.raises(ValueError, match="not cumulative"):
        real_vllm.per_run_counters(runs)


def test_the_sim_real_table_counts_by_policy(real_vllm: ModuleType, tmp_path: Path, capsys: Any) -> None:
    def entry(policy: str, ttft: float) -> dict[str, Any]:
        ms = {"p50": 1000 * ttft, "p99": 2000 * ttft}
        return {"workload": "chat", "policy": policy, "rate": 1, "requests": 1, "worker_counters_since": "run",
                "ttft_ms": ms, "tpot_ms": ms, "e2e_ms": ms}  # fmt: skip

    real, sim = tmp_path / "real.json", tmp_path / "sim.json"
    real.write_text(json.dumps([entry("round_robin", 1.0), entry("predictive", 1.0)]))
    sim.write_text(json.dumps([entry("round_robin", 1.05), entry("predictive", 1.5)]))  # predictive routed apart
    real_vllm.main(["table", "--real", str(real), "--sim", str(sim)])
    out = capsys.readouterr().out
    assert "within 10% by policy: round_robin 6/6, predictive 0/6" in out
    assert "6 of 12 sim latencies within 10% of real" in out


def test_the_configs_move_the_real_workers_behind_proxies_and_twin_them_with_sims(
    real_vllm: ModuleType, tmp_path: Path
) -> None:
    import yaml

    config = Path(__file__).parents[2] / "examples" / "h200-real.yaml"
    real, sim = tmp_path / "real.yaml", tmp_path / "sim.yaml"
    real_vllm.main(["configs", str(config), "--real-out", str(real), "--sim-out", str(sim), "--speedup", "0.5"])
    src, r, s = (yaml.safe_load(p.read_text()) for p in (config, real, sim))
    for i, (b0, b1, b2) in enumerate(zip(src["backends"], r["backends"], s["backends"], strict=True), 1):
        assert int(b1["url"].rsplit(":", 1)[1]) == int(b0["url"].rsplit(":", 1)[1]) + real_vllm.PROXY_OFFSET
        assert "launch" not in b1 and "launch" not in b2 and b2["gpu"] == b0["gpu"]
        assert b2["sim"] == {"profile": b0["profile"], "speedup": 0.5, "seed": i, "kv_tokens": b0["kv_budget_tokens"]}
    assert r["agents"] == s["agents"] == src["agents"]


def _peer_entry(policy: str, seed: int, wf_p50: float, success: float, share: dict[str, float]) -> dict[str, Any]:
    return {"policy": policy, "seed": seed, "workflow_e2e_ms": {"p50": wf_p50}, "workflows": 100,
            "task_success": success, "sla_attainment": 1.0, "tpot_ms": {"p50": 6.5}, "model_share": share}  # fmt: skip


def test_peers_names_each_cost_and_divides_by_the_peer_per_seed(
    real_vllm: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for seed, (peer, w6, w24) in enumerate(((4000.0, 5000.0, 8000.0), (4400.0, 4400.0, 5500.0)), 1):
        (d := tmp_path / f"mixed-w6-s{seed}").mkdir()
        (d / "real-mixed.json").write_text(json.dumps([
            _peer_entry("vllm-router:cache_aware", seed, peer, 0.95, {"7b": 1.0}),
            _peer_entry("predictive", seed, w6, 0.90, {"1.5b": 0.4, "7b": 0.6})]))  # fmt: skip
        (d := tmp_path / f"mixed-w24-s{seed}").mkdir()
        (d / "real-mixed.json").write_text(json.dumps([_peer_entry("predictive", seed, w24, 0.93, {"7b": 1.0})]))
    (d := tmp_path / "chat-s1").mkdir()
    (d / "real-chat.json").write_text(json.dumps([_peer_entry("predictive", 1, 900.0, 0.9, {"7b": 1.0})]))
    real_vllm.main(["peers", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    merged = json.loads((tmp_path / "real-mixed.json").read_text())
    assert sorted({e["policy"] for e in merged}) == ["predictive_w24", "predictive_w6", "vllm-router:cache_aware"]
    assert json.loads((tmp_path / "real-chat.json").read_text())[0]["policy"] == "predictive"  # one cost: its name
    rows = {line.split(" | ")[0]: line.split(" | ") for line in lines if " | " in line and ":" not in line[:8]}
    assert rows["predictive_w6"][2] == "0.80, 1.00" and rows["predictive_w24"][2] == "0.50, 0.80"
    assert rows["predictive_w6"][3] == "90.0" and rows["predictive_w6"][6] == "1.5b 40% / 7b 60%"
    assert lines[1].startswith("vllm-router:cache_aware | 4200 ± 283 | 1.00, 1.00")  # the peer first
