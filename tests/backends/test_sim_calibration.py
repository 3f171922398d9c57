"""The tools that fit the sim's profiles (scripts/calibrate) and compare it with real vLLM (scripts/real_vllm.py)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from backends.listen import free_port, wait_ready
from router.core.profile import PROFILE_DIR, load_profile

SCRIPTS = Path(__file__).parents[2] / "scripts"
DATA = SCRIPTS / "calibrate" / "data"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def real_vllm() -> ModuleType:
    return _load("real_vllm", SCRIPTS / "real_vllm.py")


@pytest.fixture(scope="module")
def fit_profile() -> ModuleType:
    return _load("fit_profile", SCRIPTS / "calibrate" / "fit_profile.py")


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


def test_each_boot_weighs_the_same_in_the_step_fit(fit_profile: ModuleType) -> None:
    # one slow boot with one decode point, one fast boot with nine: by point the fit follows the fast boot
    rows = [fit_profile.decode_row(1, 100, 3.0, "r1 decode b1 p100")]
    rows += [fit_profile.decode_row(1, 100, 2.0, f"r2.{k} decode b1 p100") for k in range(9)]
    by_point, by_boot = (fit_profile.fit(rows, ("base",), by_boot=b)[0] for b in (False, True))
    assert by_point * 1e3 == pytest.approx(2.05, abs=0.01)
    assert by_boot * 1e3 == pytest.approx(2.31, abs=0.01)  # between the boots (relative least squares)
    assert [fit_profile.boot_of(r) for r in rows[:2]] == ["r1", "r2"]


def _sources(profile: dict[str, Any]) -> tuple[list[Path], list[Path]]:
    """The probe files (in run order) and co-location probes a shipped profile names as its raw data."""
    source = profile["raw"]["source"]
    runs = [DATA / Path(f).name for f in re.findall(r"([\w./-]+\.json) \(run \d+\)", source)]
    colocate = sorted(DATA.glob("colocate-h200*.json")) if "colocate-h200*.json" in source else []
    return runs, colocate


@pytest.mark.parametrize("name", ["h200-qwen2.5-0.5b", "h200-qwen2.5-1.5b", "h200-qwen2.5-7b", "h200-qwen2.5-14b"])
def test_the_fit_on_the_committed_probes_gives_the_shipped_step_terms(
    fit_profile: ModuleType, name: str, capsys: Any
) -> None:
    pytest.importorskip("scipy")
    shipped = json.loads((PROFILE_DIR / f"{name}.json").read_text())
    runs, colocate = _sources(shipped)
    assert runs and all(f.exists() for f in runs + colocate)  # the raw data of a shipped profile is kept
    args = argparse.Namespace(model=shipped["model"], quality=shipped["quality"], kv_tokens=0, name=name, out=None,
                              max_num_seqs=1024, max_model_len=16384, weight="boot", no_mix=False, sim_http_ms=3.0,
                              note="", probes=[str(f) for f in runs], colocate=[str(f) for f in colocate])  # fmt: skip
    got = fit_profile.fit_profile(args, [json.loads(f.read_text()) for f in runs],
                                  [json.loads(f.read_text()) for f in colocate])  # fmt: skip
    capsys.readouterr()
    tuned = set(shipped["provenance"].get("tuned", {}).get("fitted", {}))  # moved after the fit, on replays
    for section in ("step_time_s", "cudagraph"):
        for key, value in shipped[section].items():
            if f"{section}.{key}" not in tuned:
                assert got[section][key] == pytest.approx(value, rel=1e-3, abs=1e-12), f"{section}.{key}"
    assert got["frontend_s"]["per_prompt_token"] == pytest.approx(shipped["frontend_s"]["per_prompt_token"], rel=1e-3)
    assert got["kv_budget_tokens"] == shipped["kv_budget_tokens"]  # from the probed server's cache config


@pytest.mark.slow
def test_probe_and_fit_recover_a_simulated_workers_decode_step(tmp_path: Path) -> None:
    pytest.importorskip("scipy")
    port, speedup = free_port(), 0.5  # the sim slowed down, so that a busy CI machine keeps its pace
    sim = subprocess.Popen([sys.executable, "-m", "router.cli", "sim", "--port", str(port), "--model", "m",
                            "--profile", "h200-qwen2.5-0.5b", "--speedup", str(speedup)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    probe, prof = tmp_path / "probe.json", tmp_path / "m.json"
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", 30, proc=sim)
        subprocess.run([sys.executable, str(SCRIPTS / "calibrate" / "probe.py"), "--url", f"http://127.0.0.1:{port}",
                        "--model", "m", "--out", str(probe), "--procs", "2", "--speedup", str(speedup),
                        "--phases", "ttft,tpot", "--ttft-reps", "1", "--batches", "1,8,32", "--tpot-out", "48"],
                       check=True, capture_output=True, timeout=240)  # fmt: skip
    finally:
        sim.terminate()
        sim.wait(10)
    subprocess.run([sys.executable, str(SCRIPTS / "calibrate" / "fit_profile.py"), "--model", "m", str(probe),
                    "--out", str(prof)], check=True, capture_output=True, timeout=120)  # fmt: skip
    fitted, truth = load_profile(str(prof)), load_profile("h200-qwen2.5-0.5b")
    assert fitted.kv_budget_tokens == truth.kv_budget_tokens  # read off the worker's /metrics

    def decode_step(p: Any, batch: int) -> float:
        s = p.step_time
        return float(s.base + batch * s.decode_seqs + batch * 300 * s.decode_context_tokens)

    for batch in (1, 32):
        assert decode_step(fitted, batch) == pytest.approx(decode_step(truth, batch), rel=0.25), batch
