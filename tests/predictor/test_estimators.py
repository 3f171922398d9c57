"""scikit-learn estimator rules, the packed forest, and versioned artifacts."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.exceptions import NotFittedError
from threadpoolctl import threadpool_limits

from predictor import artifact
from predictor.dataset import read_logs, samples
from predictor.forest import PackedForest
from predictor.latency import LatencyModel
from predictor.length import OutputLengthModel
from predictor.model import Predictor, quality_extras
from predictor.quality import QualityModel, term_matrix
from router.core.errors import ArtifactError
from tests.predictor.synth import records

SMALL = {"max_iter": 15, "min_samples": 20}


def small_predictor() -> Predictor:
    return Predictor(length=OutputLengthModel(**SMALL), latency=LatencyModel(**SMALL))


@pytest.fixture(scope="module")
def fitted() -> Predictor:
    recs = records(300)
    scores = {r["request_id"]: float(r["model"] == "qwen2.5-7b") for r in recs}
    with threadpool_limits(limits=1, user_api="openmp"):
        return small_predictor().fit(samples(recs, scores))


def test_init_only_stores_hyper_parameters_and_clone_works() -> None:
    p = Predictor(length=OutputLengthModel(max_iter=7))
    assert p.get_params()["length__max_iter"] == 7 and p.get_params()["calibration"] == 0.25
    assert not [k for k in vars(p) if k.endswith("_")]
    assert clone(p).get_params()["length__max_iter"] == 7


def test_not_fitted_errors() -> None:
    s = samples(records(1))[0]
    with pytest.raises(NotFittedError):
        Predictor().predict(s.features, (s.view,), (s.profile,))
    with pytest.raises(NotFittedError):
        OutputLengthModel().predict(np.zeros((1, 3)))
    with pytest.raises(NotFittedError):
        QualityModel().predict_proba(np.zeros(4, dtype=int), np.zeros(2), "a", ["m"], np.asarray([0.5]))


def test_fit_returns_self_and_learns_state(fitted: Predictor) -> None:
    data = samples(records(50, seed=3))
    p = small_predictor()
    assert p.fit(data) is p
    assert fitted.length_.learned(0) and fitted.latency_.learned(0) and fitted.quality_.models_
    s = data[0]
    pred = fitted.predict(s.features, (s.view, s.view), (s.profile, s.profile))
    assert pred.ttft.shape == (2, 2) and (pred.ttft[:, 1] >= pred.ttft[:, 0]).all()
    assert (pred.output[:, 0] <= 2048).all()


def test_quality_learns_from_feedback(fitted: Predictor) -> None:
    s = samples(records(1))[0]
    f = s.features
    q = fitted.quality_.predict_proba(f.terms, quality_extras(f), f.agent, ["qwen2.5-7b", "qwen2.5-0.5b", "unseen"],
                                      np.asarray([0.5, 0.5, 0.42]))  # fmt: skip
    assert q[0] > 0.7 and q[1] < 0.3 and q[2] == 0.42


def test_quality_learns_which_words_make_a_task_hard() -> None:
    """The simulator's law: logit P(correct) = 8 (quality - difficulty), difficulty set by a topic word
    among filler words; one regression per role pooled over the models learns the words' difficulty."""
    rng = np.random.default_rng(0)
    topics = {11: 0.1, 12: 0.3, 13: 0.5, 14: 0.7, 15: 0.9}
    quality = {"small": 0.6, "big": 0.8}
    terms, y, models, roles = [], [], [], []
    for _ in range(3000):
        topic = int(rng.choice(list(topics)))
        model = str(rng.choice(list(quality)))
        role = str(rng.choice(["coder", "tester"]))
        d = topics[topic] * (1.0 if role == "coder" else 0.4)
        terms.append([topic, *rng.choice(np.arange(100, 300), size=40, replace=False).tolist()])
        y.append(rng.random() < 1.0 / (1.0 + np.exp(-8.0 * (quality[model] - d))))
        models.append(model)
        roles.append(role)
    qm = QualityModel(C=1.0).fit(term_matrix(terms, np.zeros((len(y), 0)), 4096), y, models, roles)
    assert qm.groups_ == ("coder", "tester", "*")

    def p(topic: int, role: str) -> np.ndarray:
        return qm.predict_proba(np.asarray([topic, *range(100, 140)]), np.zeros(0), role, ["small", "big", "x"],
                                np.asarray([0.5, 0.5, 0.5]))  # fmt: skip

    easy, hard = p(11, "coder"), p(15, "coder")
    assert easy[0] > 0.75 and hard[0] < 0.35 and hard[1] > hard[0] + 0.1  # difficulty- and model-aware
    assert p(15, "tester")[0] > hard[0] + 0.2  # the same words are easier for the tester
    assert p(13, "nobody")[2] == 0.5  # an unseen model keeps its prior; an unseen role uses the pooled fit


def test_quality_learns_what_a_word_means_to_each_model() -> None:
    """A checker's verdict is good when it agrees with the truth of the answer it checks: the small
    model rejects wrong answers as reliably as the big one but fails more correct ones. The word that
    marks the checked answer as wrong (term 7) then favours a different model than its absence; one
    offset per model (``per_model_terms=False``) cannot say so and ranks them the same either way."""
    rng = np.random.default_rng(3)
    p_good = {("small", True): 0.98, ("small", False): 0.85, ("big", True): 0.83, ("big", False): 0.98}
    terms, y, models = [], [], []
    for _ in range(1200):
        model, wrong = str(rng.choice(["small", "big"])), bool(rng.random() < 0.35)
        terms.append([*([7] if wrong else []), *rng.choice(np.arange(100, 400), size=30, replace=False).tolist()])
        y.append(rng.random() < p_good[(model, wrong)])
        models.append(model)
    X = term_matrix(terms, np.zeros((len(y), 0)), 4096)
    fillers = [rng.choice(np.arange(100, 400), size=30, replace=False) for _ in range(100)]  # fresh prompts

    def p(qm: QualityModel, wrong: bool) -> np.ndarray:
        rows = [np.asarray([*([7] if wrong else []), *f]) for f in fillers]
        return np.mean([qm.predict_proba(t, np.zeros(0), "tester", ["small", "big"], np.full(2, 0.5)) for t in rows], 0)

    qm = QualityModel(per_model_terms=True).fit(X, y, models, ["tester"] * len(y))
    assert p(qm, wrong=True)[0] > p(qm, wrong=True)[1] and p(qm, wrong=False)[1] > p(qm, wrong=False)[0] + 0.05
    offsets_only = QualityModel().fit(X, y, models, ["tester"] * len(y))  # the default
    assert offsets_only.model_term_coef_ is None
    a, b = p(offsets_only, wrong=True), p(offsets_only, wrong=False)
    assert (a[0] > a[1]) == (b[0] > b[1])  # the same order whatever the checked answer was


def test_decision_subset_of_models_equals_the_full_prediction(fitted: Predictor) -> None:
    s = samples(records(5, seed=4))[0]
    X = np.random.default_rng(1).random((8, fitted.latency_.n_features_in_))
    full = fitted.latency_.predict(X)
    sub = fitted.latency_.predict(X, ((0, 0), (2, 1)))
    np.testing.assert_array_equal(sub[:, 0, 0], full[:, 0, 0])
    np.testing.assert_array_equal(sub[:, 2, 1], full[:, 2, 1])
    assert np.isnan(sub[:, 1, :]).all() and np.isnan(sub[:, 0, 1]).all()
    np.testing.assert_array_equal(fitted.latency_.predict(X, ((0, 0), (2, 1))), sub)  # the cached sub-forest
    # The decision keeps TPOT out of the hot path: it comes from the prior, the rest is unchanged.
    pred = fitted.predict(s.features, (s.view,) * 3, (s.profile,) * 3)
    assert np.isfinite(pred.tpot).all() and np.isfinite(pred.e2e).all() and (pred.e2e[:, 1] >= pred.e2e[:, 0]).all()


def test_slots_of_unlearned_targets_give_nan() -> None:
    rng = np.random.default_rng(2)
    X, Y = rng.random((200, 3)), rng.random((200, 2)) + 0.5
    Y[:190, 0] = np.nan  # too few rows for target 0: only target 1 is learned
    m = OutputLengthModel(**SMALL).fit(X, Y)
    assert not m.learned(0) and m.learned(1)
    assert np.isnan(m.predict(X[:4], ((0, 0), (0, 1)))).all()  # a walk of nothing, not the whole forest
    assert np.isfinite(m.predict(X[:4], ((1, 0),))[:, 1, 0]).all()


def test_packed_forest_equals_sklearn() -> None:
    rng = np.random.default_rng(0)
    X, y = rng.random((400, 5)), rng.random(400)
    models = [HistGradientBoostingRegressor(loss="quantile", quantile=q, max_iter=10).fit(X, y) for q in (0.5, 0.9)]
    forest = PackedForest(models)
    for n in (1, 8, 70):  # 70: more rows than one walk's block
        Xq = rng.random((n, 5))
        Xq[: n // 2, 1] = X[: n // 2, 1]  # values that were split on
        expect = np.stack([m.predict(Xq) for m in models], axis=1)
        np.testing.assert_allclose(forest.predict(Xq), expect, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(pickle.loads(pickle.dumps(forest)).predict(Xq), forest.predict(Xq))
    with pytest.raises(ValueError, match="5 features"):
        forest.predict(rng.random((2, 4)))


def test_save_load_round_trip(fitted: Predictor, tmp_path: Path) -> None:
    path = tmp_path / "p.pkl"
    header = artifact.save(fitted, path, {"samples": 300})
    assert header["versions"] == artifact.versions() and header["schema"] == artifact.SCHEMA_VERSION
    loaded, h = artifact.load(path)
    s = samples(records(3, seed=9))[0]
    a, b = fitted.predict(s.features, (s.view,), (s.profile,)), loaded.predict(s.features, (s.view,), (s.profile,))
    np.testing.assert_array_equal(a.e2e, b.e2e)
    assert h["meta"] == {"samples": 300}


def test_mismatched_versions_and_schema_are_refused(fitted: Predictor, tmp_path: Path) -> None:
    path = tmp_path / "old.pkl"
    header = {"format": artifact.FORMAT, "schema": artifact.SCHEMA_VERSION, "meta": {},
              "versions": {**artifact.versions(), "sklearn": "0.0.1"}}  # fmt: skip
    artifact.write(path, header, fitted)
    with pytest.raises(ArtifactError, match=r"sklearn 0\.0\.1"):
        artifact.load(path)
    artifact.write(path, {**header, "versions": artifact.versions(), "schema": 999}, fitted)
    with pytest.raises(ArtifactError, match="schema 999"):
        artifact.load(path)
    artifact.write(path, {**header, "versions": artifact.versions(), "schema": 4}, fitted)
    with pytest.raises(ArtifactError, match=r"schema 4 .*lacks the prior's eager .*, the quality model's"):
        artifact.load(path)
    artifact.write(path, {**header, "versions": artifact.versions(), "schema": 3}, fitted)
    with pytest.raises(ArtifactError, match=r"schema 3 .*prefill backlog, the latency p90s' calibration per"):
        artifact.load(path)
    artifact.write(path, {**header, "versions": artifact.versions(), "schema": 2}, fitted)
    with pytest.raises(ArtifactError, match=r"schema 2 .*per load bucket, the p90s' conformal calibration"):
        artifact.load(path)
    path.write_bytes(pickle.dumps({"something": "else"}))
    with pytest.raises(ArtifactError, match="not a chimera predictor"):
        artifact.load(path)
    artifact.save(fitted, path, {})
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # an interrupted copy: the header whole, the model cut off
    with pytest.raises(ArtifactError, match="cannot read the predictor's model"):
        artifact.load(path)
    path.write_bytes(whole[:3])  # the header itself cut off
    with pytest.raises(ArtifactError, match="cannot read a predictor"):
        artifact.load(path)


def test_log_lines_with_fields_of_the_wrong_type_are_skipped(tmp_path: Path) -> None:
    """A log is read as far as it makes sense: a line whose ``ts``, ``fleet`` or numbers are not what a
    request record holds is skipped (as unparsable lines are), not a traceback for the whole file."""
    good = records(20, seed=4)
    bad = [dict(good[0], request_id="b1", ts="yesterday"), dict(good[1], request_id="b2", fleet="x"),
           dict(good[2], request_id="b3", workflow_id="w", completion_tokens="lots"),
           dict(good[3], request_id="b4", prompt_tokens="many")]  # fmt: skip
    # a workflow request that failed has no completion tokens (null): it counts for no remaining output
    failed = dict(good[4], request_id="f1", workflow_id="w", outcome="server_error", completion_tokens=None)
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [*good, *bad, failed]) + "\nnot json\n")
    got = read_logs([path])
    assert len(got) == len(samples(good)) == 20  # the bad lines (and the unparsable one) left out


def test_a_verdict_counts_only_from_the_agent_whose_request_it_was(tmp_path: Path) -> None:
    from predictor.dataset import read_log

    good = records(3, seed=5)
    verdicts = [{"type": "feedback", "request_id": good[0]["request_id"], "score": 1.0, "agent": good[0]["agent"]},
                {"type": "feedback", "request_id": good[1]["request_id"], "score": 0.0, "agent": "someone-else"},
                {"type": "feedback", "request_id": good[2]["request_id"], "score": 0.5}]  # (an older log: no agent)
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [*good, *verdicts]) + "\n")
    _, feedback = read_log(path)
    assert feedback == {good[0]["request_id"]: 1.0, good[2]["request_id"]: 0.5}

