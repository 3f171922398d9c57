"""The scripts that fit the sim's profiles and compare it with real vLLM (scripts/calibrate, scripts/real_vllm.py)."""

from __future__ import annotations

import importlib.util
import sys
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
    sys.path.insert(0, str(SCRIPTS))  # real_vllm.py imports fleet_report from its own folder
    try:
        return _load("real_vllm", SCRIPTS / "real_vllm.py")
    finally:
        sys.path.remove(str(SCRIPTS))


def _entry(workload: str, policy: str, **counters: tuple[float, float]) -> dict[str, Any]:
    workers = {w: {"prefix_cache_queries": q, "prefix_cache_hits": h} for w, (q, h) in counters.items()}
    return {"workload": workload, "policy": policy, "requests": 1, "worker_counters": workers}


def test_real_counters_of_one_boot_are_taken_per_run(real_vllm: ModuleType) -> None:
    # h200_validate.sh boots the workers once: the bench's counters after each run count from the boot
    # (chat 10 % hits, then a mixed run of 50 %, which the cumulative counters show as 37 %)
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


def test_each_boot_weighs_the_same_in_the_step_fit() -> None:
    pytest.importorskip("scipy")
    fit_profile = _load("fit_profile", SCRIPTS / "calibrate" / "fit_profile.py")
    # one slow boot with one decode point, one fast boot with nine: by point the fit follows the fast boot
    rows = [fit_profile.decode_row(1, 100, 3.0, "r1 decode b1 p100")]
    rows += [fit_profile.decode_row(1, 100, 2.0, f"r2.{k} decode b1 p100") for k in range(9)]
    by_point, by_boot = (fit_profile.fit(rows, ("base",), by_boot=b)[0] for b in (False, True))
    assert by_point * 1e3 == pytest.approx(2.05, abs=0.01)
    assert by_boot * 1e3 == pytest.approx(2.31, abs=0.01)  # between the boots (relative least squares)
    assert [fit_profile.boot_of(r) for r in rows[:2]] == ["r1", "r2"]


def test_the_co_location_check_runs_the_profiles_own_steps() -> None:
    colocate = _load("colocate", SCRIPTS / "calibrate" / "colocate.py")
    step = {"base": 0.002, "decode_seqs": 0.0, "decode_context_tokens": 0.0}
    profiles = {m: {"step_time_s": step, "gpu_share": 0.5} for m in ("a", "b")}
    probe = {"prompt": 100, "tokens": 100, "phases": [
        {"subset": ["a"], "batch": 1, "tpot_ms": {"a": 2.0}},
        {"subset": ["a"], "batch": 1, "tpot_ms": {"a": 2.5}, "sampling": "bench"},  # not the fitted kind: skipped
        {"subset": ["a", "b"], "batch": 1, "tpot_ms": {"a": 3.0, "b": 3.0}},
    ]}  # fmt: skip
    alone, shared = colocate.predicted_phases(probe, profiles, q_ms=1.44, switch_ms=0.5)
    assert alone["tpot_ms"] == {"a": pytest.approx(2.0)}
    # two 1 ms GPU parts that fit a slice lock-step: both turns and two switches, the 1 ms CPU parts hidden
    assert shared["tpot_ms"] == {"a": pytest.approx(3.0, rel=0.02), "b": pytest.approx(3.0, rel=0.02)}
