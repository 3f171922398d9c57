"""The model-free policies: pure functions of (features, snapshot), deterministic, complete rankings."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from router.core.config import PolicyOptions, load_config
from router.core.errors import ConfigError
from router.core.types import BackendView, Decision, FleetSnapshot, Policy, RequestFeatures
from router.policies import available, create_policy
from router.policies.basic import least_kv, least_outstanding, make_length_split, round_robin
from tests.conftest import make_config

LENGTH_SPLIT = make_length_split(PolicyOptions(long_prompt_tokens=1000, long_tag="long"))
ALL: dict[str, Policy] = {
    "round_robin": round_robin,
    "least_outstanding": least_outstanding,
    "least_kv": least_kv,
    "length_split": LENGTH_SPLIT,
}


def feats(seq: int = 0, prompt_tokens: int = 100, models: tuple[str, ...] = ("m",)) -> RequestFeatures:
    return RequestFeatures(
        agent="a", endpoint="chat", models=models, prompt_tokens=prompt_tokens, max_tokens=None, stream=False, seq=seq
    )


def bv(name: str, **kw: object) -> BackendView:
    kw.setdefault("model", "m")
    kw.setdefault("kv_budget_tokens", 1000)
    return BackendView(name=name, **kw)  # type: ignore[arg-type]


def snap(*backends: BackendView) -> FleetSnapshot:
    return FleetSnapshot(tuple(backends), taken_at=1.0)


FLEET = snap(
    bv("a", inflight_requests=2, kv_usage=0.1),
    bv("b", inflight_requests=0, kv_usage=0.7, tags=frozenset({"long"})),
    bv("c", inflight_requests=1, kv_usage=None),
    bv("d", inflight_requests=0, kv_usage=0.3, tags=frozenset({"long"})),
)


# -- properties every policy has ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("seq", [0, 1, 5])
@pytest.mark.parametrize("prompt_tokens", [10, 5000])
def test_every_eligible_worker_ranked_once(name: str, seq: int, prompt_tokens: int) -> None:
    d = ALL[name](feats(seq, prompt_tokens), FLEET)
    assert isinstance(d, Decision)
    assert sorted(d.ranked) == ["a", "b", "c", "d"]
    assert d.reason


@pytest.mark.parametrize("name", sorted(ALL))
def test_pure_and_deterministic(name: str) -> None:
    f = feats(seq=3)
    copy = FleetSnapshot(FLEET.backends, FLEET.taken_at)
    results = [ALL[name](f, FLEET) for _ in range(5)]
    assert all(r == results[0] for r in results)
    assert FLEET == copy


@pytest.mark.parametrize("name", sorted(ALL))
def test_empty_snapshot(name: str) -> None:
    assert ALL[name](feats(), snap()).ranked == ()


@pytest.mark.parametrize("name", sorted(ALL))
def test_single_worker(name: str) -> None:
    assert ALL[name](feats(seq=7), snap(bv("only"))).ranked == ("only",)


def test_registry() -> None:
    assert set(ALL) <= set(available())
    for name in ALL:
        config = make_config([{"name": "w", "url": "http://127.0.0.1:1", "model": "m"}], policy=name,
                             policy_options={"long_prompt_tokens": 1000})  # fmt: skip
        for f in (feats(seq=2), feats(seq=3, prompt_tokens=5000)):
            assert create_policy(config)(f, FLEET) == ALL[name](f, FLEET)


def test_an_unknown_policy_is_refused_with_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("gateway:\n  policy: nope\nbackends:\n  - {name: w, url: 'http://127.0.0.1:1', model: m, "
                    "kv_budget_tokens: 1000, max_model_len: 512}\nagents:\n  - {name: a, models: [m]}\n")  # fmt: skip
    with pytest.raises(ConfigError, match=r"c\.yaml:2: gateway\.policy: unknown policy 'nope' \(available: "):
        create_policy(load_config(path))


# -- round robin --------------------------------------------------------------------------------


def test_round_robin_rotates_by_seq() -> None:
    s = snap(bv("a"), bv("b"), bv("c"))
    firsts = [round_robin(feats(seq=i), s).ranked for i in range(6)]
    assert [r[0] for r in firsts] == ["a", "b", "c", "a", "b", "c"]
    assert firsts[1] == ("b", "c", "a")


def test_round_robin_ignores_load() -> None:
    s = snap(bv("a", inflight_requests=100), bv("b"))
    assert round_robin(feats(seq=0), s).ranked[0] == "a"


# -- least outstanding --------------------------------------------------------------------------


def test_least_outstanding_orders_by_inflight() -> None:
    s = snap(bv("a", inflight_requests=3), bv("b", inflight_requests=1), bv("c", inflight_requests=2))
    assert least_outstanding(feats(), s).ranked == ("b", "c", "a")


def test_least_outstanding_breaks_ties_by_reserved_tokens_share_then_waiting() -> None:
    s = snap(
        bv("a", inflight_requests=1, inflight_tokens=500, kv_budget_tokens=1000),
        bv("b", inflight_requests=1, inflight_tokens=500, kv_budget_tokens=4000),
        bv("c", inflight_requests=1, inflight_tokens=500, kv_budget_tokens=4000, waiting=3),
    )
    assert least_outstanding(feats(), s).ranked == ("b", "c", "a")


def test_least_outstanding_rotates_exact_ties() -> None:
    s = snap(bv("a"), bv("b"), bv("c"))
    firsts = Counter(least_outstanding(feats(seq=i), s).ranked[0] for i in range(30))
    assert firsts == {"a": 10, "b": 10, "c": 10}


def test_least_outstanding_tie_rotation_reaches_every_tied_worker() -> None:
    s = snap(bv("a"), bv("b"), bv("c"), bv("d", inflight_requests=1))
    firsts = Counter(least_outstanding(feats(seq=i), s).ranked[0] for i in range(40))
    assert set(firsts) == {"a", "b", "c"}
    assert all(least_outstanding(feats(seq=i), s).ranked[-1] == "d" for i in range(5))


def test_least_outstanding_tie_rotation_is_even_when_only_some_are_tied() -> None:
    s = snap(bv("a"), bv("b"), bv("c"), bv("d", inflight_requests=1))
    firsts = Counter(least_outstanding(feats(seq=i), s).ranked[0] for i in range(30))
    assert firsts == {"a": 10, "b": 10, "c": 10}


# -- least KV -----------------------------------------------------------------------------------


def test_least_kv_orders_by_kv_usage_then_inflight() -> None:
    s = snap(
        bv("a", kv_usage=0.5, inflight_requests=0),
        bv("b", kv_usage=0.2, inflight_requests=5),
        bv("c", kv_usage=0.2, inflight_requests=1),
    )
    assert least_kv(feats(), s).ranked == ("c", "b", "a")


def test_least_kv_unscraped_counts_as_empty() -> None:
    s = snap(bv("a", kv_usage=0.1), bv("b", kv_usage=None, inflight_requests=2))
    assert least_kv(feats(), s).ranked == ("b", "a")


# -- length split -------------------------------------------------------------------------------


def test_length_split_long_prompts_to_long_pool() -> None:
    d = LENGTH_SPLIT(feats(prompt_tokens=1000), FLEET)  # at the threshold counts as long
    assert set(d.ranked[:2]) == {"b", "d"} and d.ranked[:2] == ("b", "d")
    assert d.ranked[2:] == ("c", "a")  # the short pool is the fallback, least loaded first
    assert d.reason.endswith("long")


def test_length_split_short_prompts_to_short_pool() -> None:
    d = LENGTH_SPLIT(feats(prompt_tokens=999), FLEET)
    assert d.ranked == ("c", "a", "b", "d")
    assert d.reason.endswith("short")


def test_length_split_falls_back_when_a_pool_is_empty() -> None:
    shorts = snap(bv("a", inflight_requests=1), bv("c"))
    assert LENGTH_SPLIT(feats(prompt_tokens=5000), shorts).ranked == ("c", "a")
    longs = snap(bv("b", tags=frozenset({"long"})))
    assert LENGTH_SPLIT(feats(prompt_tokens=10), longs).ranked == ("b",)


def test_length_split_respects_custom_tag() -> None:
    pol = make_length_split(PolicyOptions(long_prompt_tokens=10, long_tag="big"))
    s = snap(bv("a", tags=frozenset({"long"})), bv("b", tags=frozenset({"big"})))
    assert pol(feats(prompt_tokens=20), s).ranked == ("b", "a")


# -- FleetSnapshot.eligible ---------------------------------------------------------------------


def test_eligible_filters_unhealthy_wrong_model_and_too_long() -> None:
    s = snap(
        bv("ok"),
        bv("sick", healthy=False),
        bv("other", model="m2"),
        bv("short_ctx", max_model_len=100),
        bv("exact_ctx", max_model_len=101),
    )
    assert [b.name for b in s.eligible(feats(prompt_tokens=100)).backends] == ["ok", "exact_ctx"]
    both = s.eligible(feats(prompt_tokens=100, models=("m", "m2")))
    assert [b.name for b in both.backends] == ["ok", "other", "exact_ctx"]
    assert s.eligible(feats()).taken_at == s.taken_at
    assert s.eligible(feats(models=("none",))).backends == ()


def test_by_name() -> None:
    assert FLEET.by_name("c") is FLEET.backends[2]
    assert FLEET.by_name("zzz") is None
