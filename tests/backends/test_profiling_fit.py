"""The profile fit (backends/profiling/fit.py): the shipped profiles refit from their committed probes, a profile
recovered from points it predicts itself, and a written profile refit from the probes it holds."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from backends.profiling import boots as boots_mod
from backends.profiling import fit as pf
from backends.profiling.replay import engine_makespan
from router.cli import main
from router.core.profile import PROFILE_DIR, load_profile, parse_profile

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ["h200-qwen2.5-0.5b", "h200-qwen2.5-1.5b", "h200-qwen2.5-7b", "h200-qwen2.5-14b"]


def test_each_boot_weighs_the_same_in_the_step_fit() -> None:
    # one slow boot with one decode point, one fast boot with nine: by point the fit follows the fast boot
    rows = [pf.decode_row(1, 100, 3.0, "r1 decode b1 p100", 128)]
    rows += [pf.decode_row(1, 100, 2.0, f"r2.{k} decode b1 p100", 128) for k in range(9)]
    by_point, by_boot = (pf.fit(rows, ("base",), by_boot=b)[0] for b in (False, True))
    assert by_point * 1e3 == pytest.approx(2.05, abs=0.01)
    assert by_boot * 1e3 == pytest.approx(2.31, abs=0.01)  # between the boots (relative least squares)
    assert [pf.boot_of(r) for r in rows[:2]] == ["r1", "r2"]


@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_profiles_refit_from_their_committed_probes(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``provenance.reproduce`` run as written gives every fitted term of the shipped profile, and the fit's own
    values of the terms tuned afterwards (``provenance.tuned.fitted``)."""
    shipped = json.loads((PROFILE_DIR / f"{name}.json").read_text())
    argv = shlex.split(shipped["provenance"]["reproduce"].split(":", 1)[0])
    probes = [f for f in argv if f.startswith("docs/results/real-h200/probes/")]
    assert argv[:2] == ["chimera", "profile"] and probes and all((ROOT / f).exists() for f in probes)
    monkeypatch.chdir(ROOT)
    out = tmp_path / f"{name}.json"
    assert main([*argv[1:], "--out", str(out)]) == 0
    capsys.readouterr()
    got = json.loads(out.read_text())
    tuned = shipped["provenance"]["tuned"]["fitted"]
    for section in ("step_time_s", "cudagraph", "frontend_s", "overhead_s"):
        for key, value in shipped[section].items():
            if key in ("stream_token", "stream_wait"):  # (the split probes' fit, provenance.stream)
                continue
            want = tuned.get(f"{section}.{key}", value)
            assert got[section][key] == pytest.approx(want, rel=1e-3, abs=1e-12), f"{section}.{key}"
    for key in ("name", "model", "quality", "kv_budget_tokens", "max_num_seqs", "max_num_batched_tokens"):
        assert got[key] == shipped[key], key
    assert [p["meta"]["url"] for p in got["raw"]["probes"]] and got["provenance"]["sources"]


def _points_of(profile: Any) -> dict[str, Any]:
    """A probe's results as ``profile`` itself would measure them: lone TTFTs, steady decode steps, mixed steps and
    a burst (the makespan the engine replays)."""
    rows = {"ttft": [pf.ttft_row(n, 0.0, "", 8192, 128) for n in (32, 128, 512, 2048, 8192, 12288)],
            "tpot": [pf.decode_row(b, 300.0, 0.0, "", 128) for b in (1, 8, 32, 64, 128, 256)],
            "mix": [pf.mix_row(32, n, 500.0, 0.0, "", 8192, 128) for n in (2048, 8192)]}  # fmt: skip
    ms = {k: [t * 1e3 for t in pf.predict(profile, r)] for k, r in rows.items()}
    fe = profile.frontend
    front_ms = [1e3 * (profile.ttft_overhead_s + profile.sim_http_s + fe.per_request + fe.per_prompt_token * r["n"])
                for r in rows["ttft"]]  # the client's TTFT less the server's own prefill time  # fmt: skip
    ttft = [{"prompt": r["n"], "ttft_ms": y, "server_prefill_ms": y - f}
            for r, y, f in zip(rows["ttft"], ms["ttft"], front_ms, strict=True)]  # fmt: skip
    tpot = [{"prompt": 300, "batch": b, "steady": {"step_ms": y, "ctx_mid": 300.0}}
            for b, y in zip((1, 8, 32, 64, 128, 256), ms["tpot"], strict=True)]  # fmt: skip
    mix = {"batch": 32, "inject": [{"prompt": n, "max_gap_ms": y, "ctx_at_gap": 500.0}
                                   for n, y in zip((2048, 8192), ms["mix"], strict=True)]}  # fmt: skip
    burst = {"requests": 256, "prompt": 64, "out": 16, "makespan_s": engine_makespan(profile, 256, 64, 16)}
    meta = {"url": "http://w", "started": "2026-12-01T00:00:00", "kv_tokens": 299584, "max_model_len": 16384}
    return {"meta": meta, "warmup": {"burst": burst}, "ttft": ttft, "tpot": tpot, "mix": mix}


@pytest.mark.parametrize("name", ["h200-qwen2.5-0.5b", "h200-qwen2.5-7b"])
def test_the_fit_recovers_a_profile_from_the_points_it_predicts(name: str) -> None:
    """Every point within 2 %: the joint stage prices a lone prompt's eager chunk at the floor. The staged fit alone
    (``--staged``) fits the lone prompts linearly, so it is further off on them (on the 0.5B, whose prompts of a few
    hundred to a few thousand tokens run one eager step at the floor, 8 % with scipy 1.17 and 29 % with the scipy
    the shipped profiles were fitted with)."""
    truth = replace(load_profile(name), sim_http_s=0.003)
    probe = _points_of(truth)
    rows = pf.build_rows([probe], 8192, 128)
    got = pf.fit_profile([probe], [], pf.Settings(model="m", name="m"))
    for r, a, b in zip(rows, pf.predict(parse_profile(got), rows), pf.predict(truth, rows), strict=True):
        assert a == pytest.approx(b, rel=0.02), r["key"]
    assert got["provenance"]["fit"]["by_kind"]["decode"]["max_abs_rel_err"] < 0.001
    assert got["kv_budget_tokens"] == 299584 and got["max_model_len"] == 16384
    staged = parse_profile(pf.fit_profile([probe], [], pf.Settings(model="m", name="m", staged=True)))
    worst = max(abs(a / b - 1) for r, a, b in zip(rows, pf.predict(staged, rows), pf.predict(truth, rows), strict=True)
                if r["kind"] == "ttft")  # fmt: skip
    joint = max(abs(a / b - 1) for r, a, b in zip(rows, pf.predict(parse_profile(got), rows), pf.predict(truth, rows),
                                                 strict=True) if r["kind"] == "ttft")  # fmt: skip
    assert worst > joint and worst < 0.4


REAL = ROOT / "docs/results/real-h200/probes"


def test_two_real_boots_ttft_and_tpot_fit_within_their_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real-vLLM 1.5B's two boots (docs/profiling.md's table): the profile fitted on either boot predicts the
    other's TTFT and TPOT within the two boots' own spread; the staged fit's TTFT does not."""
    boots = [boots_mod.probes_of(json.loads((REAL / f"profile-qwen2.5-1.5b-boot{i}.json").read_text())) for i in (1, 2)]
    rows = [pf.build_rows(b, 8192, 128) for b in boots]
    for own, other in ((0, 1), (1, 0)):
        for staged in (False, True):
            prof = pf.fit_profile(boots[own], [], pf.Settings(model="qwen2.5-1.5b", name="b", staged=staged))
            fig = boots_mod.boot_figures(parse_profile(prof), rows[own], rows[other])
            assert fig["TTFT"]["spread"] == pytest.approx(0.091, abs=0.001)
            assert fig["TPOT"]["spread"] == pytest.approx(0.156, abs=0.001)
            if not staged:
                for kind in ("TTFT", "TPOT"):
                    assert fig[kind]["own"] < fig[kind]["cross"] < fig[kind]["spread"], (own, kind)
            else:
                assert fig["TTFT"]["own"] > 0.18
    b1, b2 = (str(REAL / f"profile-qwen2.5-1.5b-boot{i}.json") for i in (1, 2))
    boots_mod.main([b1, b2, "qwen2.5-1.5b"])
    argv = ["profile", "--fit", b1, "--model", "qwen2.5-1.5b", "--against", b2, "--out", str(tmp_path / "b.json")]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    table = [line for line in out if line.startswith("  TTFT ")]
    assert len(table) == 2 and table[0] == table[1] and "9.1%" in table[0]


def test_a_written_profile_refits_from_the_probes_it_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps(_points_of(replace(load_profile("h200-qwen2.5-0.5b"), sim_http_s=0.003))))
    first, again = tmp_path / "first.json", tmp_path / "again.json"
    assert main(["profile", "--fit", str(probe), "--model", "m", "--quality", "0.6", "--out", str(first)]) == 0
    assert main(["profile", "--fit", str(first), "--model", "m", "--quality", "0.6", "--out", str(again)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {again}" in out and "mean/max |error|" in out
    a, b = json.loads(first.read_text()), json.loads(again.read_text())
    assert {k: v for k, v in a.items() if k not in ("name", "provenance", "raw")} == {
        k: v for k, v in b.items() if k not in ("name", "provenance", "raw")
    }
    assert b["provenance"]["tool"] == "chimera profile" and b["raw"]["probes"] == a["raw"]["probes"]
