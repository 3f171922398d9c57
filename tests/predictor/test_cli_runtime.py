"""`chimera predictor train|eval` on a synthetic request log, and the gateway runtime's online refit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from predictor import artifact
from predictor.model import Predictor, PriorPredictor
from router.cli import main
from router.learning import PredictorRuntime
from router.requestlog import RequestRecord
from tests.conftest import make_config
from tests.predictor.synth import records, write_log


def test_train_then_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train, test = write_log(tmp_path / "train.jsonl", 300), write_log(tmp_path / "test.jsonl", 200, seed=7)
    model = tmp_path / "p.pkl"
    assert main(["predictor", "train", "--log", str(train), "--out", str(model), "--holdout", "0.2"]) == 0
    assert "heldout_e2e_ms" in capsys.readouterr().out
    assert main(["predictor", "eval", "--log", str(test), "--model", str(model), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 200
    assert 0.7 <= report["e2e_ms"]["p90_coverage"] <= 1.0 and report["ttft_ms"]["p50_mape"] < 0.3
    assert report["output_tokens"]["kendall_tau"] > 0.3
    assert report["quality"]["n"] == 200
    assert main(["predictor", "eval", "--log", str(test), "--model", "prior"]) == 0


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path / "l.jsonl", 5)
    assert main(["predictor", "eval", "--log", str(tmp_path / "missing.jsonl"), "--model", "prior"]) == 2
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(b"not a pickle")
    assert main(["predictor", "eval", "--log", str(log), "--model", str(bad)]) == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"request_id": "x", "endpoint": "chat", "outcome": "client_error"}\n')
    assert main(["predictor", "train", "--log", str(empty), "--out", str(tmp_path / "o.pkl")]) == 2
    assert "chimera: error:" in capsys.readouterr().err


async def test_runtime_refits_in_the_background_and_saves(tmp_path: Path) -> None:
    cfg = make_config([{"name": "qwen2.5-0.5b-0", "url": "http://127.0.0.1:9", "model": "qwen2.5-0.5b"},
                       {"name": "qwen2.5-7b-0", "url": "http://127.0.0.1:10", "model": "qwen2.5-7b"}],
                      policy="predictive", predictor={"refit_interval_s": 0, "min_samples": 50,
                                                      "save": str(tmp_path / "live.pkl")})  # fmt: skip
    rt = PredictorRuntime(cfg)
    await rt.start()
    assert isinstance(rt.slot.current, PriorPredictor)
    assert not await rt.refit()  # an empty window: nothing to fit
    for r in records(150):
        rec = RequestRecord(request_id=r["request_id"], endpoint="chat")
        for k, v in r.items():
            if k not in ("request_id", "endpoint", "tpot_s") and hasattr(rec, k):
                setattr(rec, k, v)
        rt.observe(rec)
    owner = next(r["agent"] for r in records(150) if r["request_id"] == "r0-1")
    assert rt.feedback("r0-1", 1.0, owner) is True and rt.feedback("unknown", 0.0, owner) is False
    assert rt.feedback("r0-1", 0.0, owner + "-other") is None  # another agent's answer: not its to grade
    for n in range(10_000):  # made-up ids wait apart: they do not push the real verdict out
        rt.feedback(f"made-up-{n}", 0.0, owner)
    assert rt._scores == {"r0-1": 1.0}
    assert await rt.refit()
    assert isinstance(rt.slot.current, Predictor) and rt.slot.version == 1
    loaded, header = artifact.load(tmp_path / "live.pkl")
    assert isinstance(loaded, Predictor) and header["meta"]["samples"] == 150
    await rt.close()


def test_a_gzipped_log_reads_as_the_plain_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rotated request logs are often gzipped: ``.gz`` is read as such; a broken one is a clear error."""
    import gzip

    plain = write_log(tmp_path / "l.jsonl", 60)
    packed = tmp_path / "l.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    reports = []
    for log in (plain, packed):
        assert main(["predictor", "eval", "--log", str(log), "--model", "prior", "--json"]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[0] == reports[1] and reports[0]["samples"] == 60
    broken = tmp_path / "b.jsonl.gz"
    broken.write_bytes(packed.read_bytes()[:-40])  # truncated
    notgz = tmp_path / "n.jsonl.gz"
    notgz.write_bytes(plain.read_bytes())
    for bad in (broken, notgz):
        assert main(["predictor", "eval", "--log", str(bad), "--model", "prior"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("chimera: error:") and bad.name in err and "Traceback" not in err


def test_fingerprint_takes_the_time_scale_out_and_sees_a_changed_term() -> None:
    import dataclasses

    from predictor.prior import fingerprint, profile_for

    a, slow = profile_for("h200-qwen2.5-0.5b"), profile_for("h200-qwen2.5-0.5b", time_scale=4.0)
    assert fingerprint(a) == fingerprint(slow)
    assert fingerprint(dataclasses.replace(a, base=a.base * 1.5)) != fingerprint(a)
    assert fingerprint(profile_for("h200-qwen2.5-7b")) != fingerprint(a)


async def test_a_model_trained_on_other_profile_terms_is_flagged_at_start_and_in_eval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """A learned model takes the prior as features; the same profile name with refitted terms gives it other inputs.
    The gateway still loads it but warns once; `chimera predictor eval` names the profiles in its report."""
    import dataclasses

    from predictor.cli import _load_samples
    from predictor.evaluate import evaluate

    train = write_log(tmp_path / "train.jsonl", 200)
    model = tmp_path / "p.pkl"
    assert main(["predictor", "train", "--log", str(train), "--out", str(model)]) == 0
    capsys.readouterr()
    shipped = json.loads((Path(__file__).parents[2] / "router/core/profiles/h200-qwen2.5-0.5b.json").read_text())
    shipped["step_time_s"]["base"] *= 2  # refitted: the same name, another step time
    refit = tmp_path / "h200-qwen2.5-0.5b.json"
    refit.write_text(json.dumps(shipped))

    def backends(profile: str) -> list[dict[str, object]]:
        return [{"name": "small", "url": "http://127.0.0.1:9", "model": "qwen2.5-0.5b", "profile": profile},
                {"name": "big", "url": "http://127.0.0.1:10", "model": "qwen2.5-7b"}]  # fmt: skip

    for profile, warned in (("h200-qwen2.5-0.5b", False), (str(refit), True)):
        caplog.clear()
        rt = PredictorRuntime(make_config(backends(profile), policy="predictive", predictor={"model": str(model)}))
        with caplog.at_level("WARNING", logger="chimera.predictor"):
            await rt.start()
        assert isinstance(rt.slot.current, Predictor)
        hits = [r.getMessage() for r in caplog.records if "trained on other terms" in r.getMessage()]
        assert (hits != []) is warned
        if warned:
            assert "h200-qwen2.5-0.5b" in hits[0] and "h200-qwen2.5-7b" not in hits[0]
        await rt.close()
    assert main(["predictor", "eval", "--log", str(train), "--model", str(model), "--json"]) == 0
    assert "profiles_changed" not in json.loads(capsys.readouterr().out)
    estimator, _ = artifact.load(model)
    data = _load_samples([str(train)])
    slower = [dataclasses.replace(s, profile=dataclasses.replace(s.profile, base=s.profile.base * 2))
              if s.profile.name == "h200-qwen2.5-0.5b" else s for s in data]  # fmt: skip
    assert evaluate(estimator, slower)["profiles_changed"] == ["h200-qwen2.5-0.5b"]
