"""The scripts that fit the sim's profiles and compare it with real vLLM (scripts/calibrate, scripts/real_vllm.py)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from collections.abc import Callable
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


def _load_from_root(name: str, path: Path) -> ModuleType:
    """A calibration script that imports the repository's packages (scripts.calibrate.*, backends.*)."""
    sys.path.insert(0, str(SCRIPTS.parent))
    try:
        return _load(name, path)
    finally:
        sys.path.remove(str(SCRIPTS.parent))


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


def test_the_median_fit_takes_each_point_once_at_its_boots_median() -> None:
    pytest.importorskip("scipy")
    fit_profile = _load("fit_profile", SCRIPTS / "calibrate" / "fit_profile.py")
    # three boots of one point, one of them slow; the other point measured once
    boots = (("r1", 10.0), ("r2", 2.0), ("c", 3.0))
    rows = [fit_profile.decode_row(1, 100, y, f"{b} decode b1 p100") for b, y in boots]
    rows.append(fit_profile.decode_row(8, 100, 3.0, "r1 decode b8 p100"))
    med = {r["key"]: r for r in fit_profile.median_rows(rows)}
    assert sorted(med) == ["m decode b1 p100", "m decode b8 p100"]
    assert med["m decode b1 p100"]["y"] == pytest.approx(0.003) and med["m decode b1 p100"]["boots"] == 3
    assert fit_profile.fit(list(med.values()), ("base",))[0] == pytest.approx(0.003, rel=0.01)


def test_one_boot_alone_is_the_reference_with_boot(tmp_path: Path) -> None:
    compare = _load_from_root("compare", SCRIPTS / "calibrate" / "compare.py")
    data = SCRIPTS / "calibrate" / "data"
    lone = json.loads((data / "boot5-probe-qwen2.5-7b.json").read_text())
    ttft = {t["prompt"]: t["ttft_ms"] for t in lone["ttft"]}
    rows = compare.table(argparse.Namespace(out_dir=str(tmp_path), models=["qwen2.5-7b"], repeats=True,
                                            boot="boot5-probe"))  # fmt: skip
    cells = {r["cell"]: r for r in rows}
    assert cells["TTFT p128"]["real_runs"] == [ttft[128]] and cells["TTFT p128"]["real"] == ttft[128]
    every = {r["cell"]: r for r in compare.table(argparse.Namespace(out_dir=str(tmp_path), models=["qwen2.5-7b"],
                                                                    repeats=True, boot=""))}  # fmt: skip
    assert len(every["TTFT p128"]["real_runs"]) > 4  # every boot (and run 2's sweeps) without it


def _tune_14b(mis_set: Callable[[dict[str, Any]], None], terms: Any) -> tuple[dict[str, Any], ...]:
    """The shipped 14B profile, ``mis_set`` in place, tuned (4 evaluations) on the given terms: shipped, mis-set,
    tuned, and the cells before and after."""
    pytest.importorskip("scipy")
    tune = _load_from_root("tune_replay", SCRIPTS / "calibrate" / "tune_replay.py")
    shipped = json.loads((SCRIPTS.parent / "router/core/profiles/h200-qwen2.5-14b.json").read_text())
    wrong = json.loads(json.dumps(shipped))
    mis_set(wrong)
    a = argparse.Namespace(hold_out=[], prior=0.05, max_nfev=4, sim_http_ms=3.0, terms=terms or tune.TERMS)
    with tempfile.TemporaryDirectory() as td:
        out, before, after = tune.tune(wrong, "qwen2.5-14b", a, Path(td))
    return shipped, wrong, out, before, after


@pytest.mark.slow
def test_tuning_through_the_engine_brings_a_mis_set_term_back() -> None:
    def mis_set(p: dict[str, Any]) -> None:
        p["step_time_s"]["base"] *= 1.5  # every step 4 ms too long: TPOTs ~+50 %

    shipped, _, out, before, after = _tune_14b(mis_set, None)
    err = lambda rows: sorted(abs(r["sim_err"]) for r in rows)[len(rows) // 2]  # noqa: E731
    assert err(before) > 0.15 and err(after) < err(before) / 2
    assert abs(out["step_time_s"]["base"] / shipped["step_time_s"]["base"] - 1) < 0.2
    assert out["cudagraph"]["max_tokens"] == shipped["cudagraph"]["max_tokens"]  # what it does not tune is kept


@pytest.mark.slow
def test_tuning_only_the_ttft_terms_leaves_the_decode_step_alone() -> None:
    def mis_set(p: dict[str, Any]) -> None:
        p["overhead_s"]["ttft"] += 0.03  # every TTFT 30 ms too long
        p["step_time_s"]["decode_seqs"] *= 1.5  # and the decode step off too, which these terms must not move

    _, wrong, out, before, after = _tune_14b(mis_set, (("overhead_s", "ttft"), ("frontend_s", "per_request")))
    ttft = lambda rows: [abs(r["sim_err"]) for r in rows if r["cell"].startswith("TTFT")]  # noqa: E731
    assert min(ttft(before)) > 0.05 and max(ttft(after)) < min(ttft(before))
    assert out["overhead_s"]["ttft"] < wrong["overhead_s"]["ttft"] - 0.02
    assert out["step_time_s"] == wrong["step_time_s"] and out["cudagraph"] == wrong["cudagraph"]


def test_with_boot_the_other_boots_are_scored_against_it(tmp_path: Path) -> None:
    compare = _load_from_root("compare", SCRIPTS / "calibrate" / "compare.py")
    a = argparse.Namespace(out_dir=str(tmp_path), models=list(compare.MODELS), repeats=True, boot="boot2-probe")
    (line,) = compare.against_boot(a)
    assert "boot2-probe" not in line.split("each alone:")[1]  # not scored against itself
    counts = [int(c.split("/")[0]) for c in line.replace(",", " ").replace(".", " ").split() if "/" in c]
    assert len(counts) == 5 and all(0 <= c <= 78 for c in counts)  # the median, then run 1, boots 3, 4, 5
    assert "probe " in line and "boot5-probe" in line


def test_the_sim_real_table_counts_by_policy(real_vllm: ModuleType, tmp_path: Path, capsys: Any) -> None:
    def entry(policy: str, ttft: float) -> dict[str, Any]:
        ms = {"p50": 1000 * ttft, "p99": 2000 * ttft}
        return {"workload": "chat", "policy": policy, "rate": 1, "requests": 1, "worker_counters_since": "run",
                "ttft_ms": ms, "tpot_ms": ms, "e2e_ms": ms}  # fmt: skip

    real, sim = tmp_path / "real.json", tmp_path / "sim.json"
    real.write_text(json.dumps([entry("round_robin", 1.0), entry("predictive", 1.0)]))
    sim.write_text(json.dumps([entry("round_robin", 1.05), entry("predictive", 1.5)]))  # predictive routed apart
    real_vllm.cmd_table(argparse.Namespace(real=[str(real)], sim=[str(sim)], real_counters="cumulative"))
    out = capsys.readouterr().out
    assert "within 10% by policy: round_robin 6/6, predictive 0/6" in out
    assert "6 of 12 sim latencies within 10% of real" in out


def test_the_switch_cost_is_fitted_to_the_profiles_own_steps() -> None:
    pytest.importorskip("scipy")
    colocate = _load("colocate", SCRIPTS / "calibrate" / "colocate.py")
    profiles = {
        "small": {"step_time_s": {"base": 0.002, "decode_seqs": 0.0, "decode_context_tokens": 0.0}, "gpu_share": 0.3},
        "big": {"step_time_s": {"base": 0.0045, "decode_seqs": 0.0, "decode_context_tokens": 0.0}, "gpu_share": 0.9},
    }
    subsets = [["small"], ["big"], ["small", "big"]]
    skeleton = {"prompt": 100, "tokens": 100, "phases": [{"subset": s, "batch": b} for b in (1, 8) for s in subsets]}
    # a probe measured on a GPU whose switch costs 0.7 ms (timeslice 1.3 ms); the probe's own alone phases are a
    # slower boot's (the fit keeps the profiles' steps: only the shared phases count)
    truth = colocate.predicted_phases(skeleton, profiles, q_ms=1.3, switch_ms=0.7)
    for p in truth:
        if len(p["subset"]) == 1:
            p["tpot_ms"] = {m: 1.3 * v for m, v in p["tpot_ms"].items()}
    bench = {"subset": ["small", "big"], "batch": 1, "sampling": "bench", "tpot_ms": {"small": 99.0, "big": 99.0}}
    probe = {**skeleton, "phases": [*truth, bench]}  # another kind of request: not fitted
    fit = colocate.fit_constants([probe], profiles)
    assert fit["phases"] == 2 and fit["switch_ms"] == pytest.approx(0.7, abs=0.05)
    shared = [p for p in truth if len(p["subset"]) > 1]
    pred = colocate.predicted_phases({**skeleton, "phases": shared}, profiles, fit["timeslice_ms"], fit["switch_ms"])
    for p, q in zip(shared, pred, strict=True):
        assert q["tpot_ms"] == pytest.approx(p["tpot_ms"], rel=0.02)


def test_per_backend_splits_one_log_by_workload_and_policy(real_vllm: ModuleType, tmp_path: Path) -> None:
    import gzip

    def row(policy: str, wf: str, backend: str, ttft: float) -> dict[str, Any]:
        return {"request_id": f"{policy}-{wf}-{ttft}", "endpoint": "chat", "ts": 1.0, "outcome": "ok", "policy": policy,
                "workflow_id": wf, "backend": backend, "ttft_s": ttft, "tpot_s": ttft / 10}  # fmt: skip

    rows = [row("round_robin", "s1-chat-0", "a", 0.04), row("round_robin", "s1-chat-1", "a", 0.06),
            row("least_outstanding", "s1-chat-0", "a", 0.02), row("round_robin", "s1-mixed-0", "b", 0.03)]  # fmt: skip
    log = tmp_path / "requests.jsonl.gz"
    with gzip.open(log, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    out = tmp_path / "pb.json"
    real_vllm.main(["per-backend", str(out), "--split", "--speedup", "0.5", f"real={log}"])
    got = json.loads(out.read_text())
    assert sorted(got) == ["real chat least_outstanding", "real chat round_robin", "real mixed round_robin"]
    assert got["real chat round_robin"]["a"] == {"requests": 2, "tpot_ms_p50": 2.5, "ttft_ms_p50": 25.0}
    assert got["real chat least_outstanding"]["a"]["ttft_ms_p50"] == 10.0


def test_by_load_buckets_ttft_by_the_requests_in_flight(real_vllm: ModuleType, tmp_path: Path) -> None:
    def row(policy: str, backend: str, ts: float, e2e: float, ttft: float, wf: str = "s1-chat-0") -> dict[str, Any]:
        return {"request_id": f"{policy}-{wf}-{ts}", "endpoint": "chat", "outcome": "ok", "policy": policy,
                "workflow_id": wf, "backend": backend, "ts": ts, "e2e_s": e2e, "ttft_s": ttft}  # fmt: skip

    rows = [
        row("round_robin", "big", 0.0, 10.0, 0.5),  # the big worker busy from 0 to 10 s
        row("round_robin", "small", 1.0, 1.0, 0.010),  # small: alone on itself, 1 on big
        row("round_robin", "small", 1.5, 1.0, 0.030),  # small: 1 on itself (the one above), 1 on big
        row("round_robin", "small", 20.0, 1.0, 0.020),  # after big finished: 0 and 0
        row("least_outstanding", "small", 1.2, 1.0, 0.040),  # another run: nothing of round robin's counts
        row("round_robin", "small", 1.2, 1.0, 0.050, wf="s1-mixed-0"),  # another workload: left out
    ]
    log = tmp_path / "requests.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "bl.json"
    real_vllm.main(["by-load", str(out), "--workload", "chat", f"real={log}"])
    own = json.loads(out.read_text())["real"]
    assert own["small"] == {"0": {"requests": 3, "ttft_ms_p50": 20.0}, "1": {"requests": 1, "ttft_ms_p50": 30.0}}
    assert own["big"] == {"0": {"requests": 1, "ttft_ms_p50": 500.0}}
    real_vllm.main(["by-load", str(out), "--workload", "chat", "--of", "big", "--cap", "1", "--speedup", "0.5",
                    f"real={log}"])  # fmt: skip
    on_big = json.loads(out.read_text())["real"]
    assert on_big == {"small": {"0": {"requests": 2, "ttft_ms_p50": 15.0}, "1": {"requests": 2, "ttft_ms_p50": 10.0}}}


@pytest.mark.parametrize("spec", ["nolabel", "=x.jsonl", "real=/nonexistent/requests-*.jsonl"])
def test_by_load_and_per_backend_refuse_a_bad_log_argument_in_one_line(
    real_vllm: ModuleType, tmp_path: Path, spec: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for cmd in ("by-load", "per-backend"):
        with pytest.raises(SystemExit) as exc:
            real_vllm.main([cmd, str(tmp_path / "out.json"), spec])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "argument runs:" in err and ("LABEL=GLOB" in err or "no request log matches" in err)
