"""Behaviour of a FleetState, written against the Protocol: every test runs against each of
``KINDS`` (Redis: the shared server on 127.0.0.1:6379, under a fresh key prefix per test)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from pydantic import ValidationError

from router.core.config import BackendConfig, Config, HealthConfig
from router.core.errors import ConfigError
from router.core.stateurl import RedisOptions, redis_options
from router.core.types import BackendView
from router.state import create_state
from router.state.base import FleetState, Reservation, ScrapedMetrics
from router.state.memory import MemoryFleetState
from router.state.redis_state import RedisFleetState
from tests.redisutil import SHARED_URL, redis_prefix

KINDS = ["memory", "redis"]
__all__ = ["redis_prefix"]  # a fixture


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


BACKENDS = (
    BackendConfig(name="a", url="http://127.0.0.1:9001", model="m1", kv_budget_tokens=1000, tags=("long",)),
    BackendConfig(name="b", url="http://127.0.0.1:9002", model="m2", kv_budget_tokens=2000, max_model_len=4096),
)
HEALTH = HealthConfig(eject_after_failures=3, readmit_after_successes=2)

StateFactory = Callable[[HealthConfig], Awaitable[FleetState]]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=KINDS)
async def make_state(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[StateFactory]:
    made: list[FleetState] = []

    async def make(health: HealthConfig = HEALTH) -> FleetState:
        if request.param == "memory":
            st: FleetState = MemoryFleetState(BACKENDS, health, clock=clock)
        else:
            prefix = request.getfixturevalue("redis_prefix")
            opts = RedisOptions(SHARED_URL, prefix=f"{prefix}-{len(made)}")
            st = RedisFleetState(BACKENDS, health, opts, clock=clock)
        await st.start()
        made.append(st)
        return st

    yield make
    for st in made:
        await st.close()


@pytest.fixture
async def state(make_state: StateFactory) -> FleetState:
    return await make_state(HEALTH)


def view(state: FleetState, name: str) -> BackendView:
    v = state.snapshot().by_name(name)
    assert v is not None
    return v


async def test_fresh_state_is_optimistic(state: FleetState) -> None:
    snap = state.snapshot()
    assert [b.name for b in snap.backends] == ["a", "b"]
    a = snap.backends[0]
    assert a.healthy and a.model == "m1" and a.kv_budget_tokens == 1000 and a.tags == frozenset({"long"})
    assert (a.inflight_requests, a.inflight_tokens, a.consecutive_failures) == (0, 0, 0)
    assert a.running is None and a.kv_usage is None and a.metrics_age_s is None
    assert a.last_success_age_s is None and a.ttft_ewma_s is None
    assert snap.backends[1].max_model_len == 4096
    assert not state.any_probe_ok()
    assert not state.degraded
    assert state.stats().errors == 0


async def test_reserve_and_release_account_requests_and_tokens(state: FleetState) -> None:
    r1 = await state.reserve("a", 100)
    r2 = await state.reserve("a", 50)
    r3 = await state.reserve("b", 7)
    assert r1.backend == "a" and r1.tokens == 100 and len({r1.id, r2.id, r3.id}) == 3
    assert (view(state, "a").inflight_requests, view(state, "a").inflight_tokens) == (2, 150)
    assert (view(state, "b").inflight_requests, view(state, "b").inflight_tokens) == (1, 7)
    await state.release(r1)
    assert (view(state, "a").inflight_requests, view(state, "a").inflight_tokens) == (1, 50)
    await state.release(r2)
    await state.release(r3)
    assert all(b.inflight_requests == 0 and b.inflight_tokens == 0 for b in state.snapshot().backends)


async def test_prompts_await_their_prefill_until_the_first_token(state: FleetState) -> None:
    """A streamed prompt is the worker's prefill backlog until its first token (or its release); a
    second first_token, a release after it, or an unknown reservation changes nothing."""
    long = await state.reserve("a", 9000, prefill=8000)
    short = await state.reserve("a", 400, prefill=200)
    whole = await state.reserve("b", 100)  # a non-streamed request: no prefill counted
    assert view(state, "a").pending_prefill_tokens == 8200 and view(state, "b").pending_prefill_tokens == 0
    state.first_token(long)
    state.first_token(long)
    state.first_token(Reservation(id="never-issued", backend="a", tokens=1))
    assert view(state, "a").pending_prefill_tokens == 200
    await state.release(long)
    assert view(state, "a").pending_prefill_tokens == 200
    await state.release(short)  # released before any token (a failure, a disconnect): no longer pending
    state.first_token(short)
    assert view(state, "a").pending_prefill_tokens == 0
    await state.release(whole)
    assert all(b.pending_prefill_tokens == 0 for b in state.snapshot().backends)


async def test_release_twice_or_unknown_never_goes_negative(state: FleetState) -> None:
    r = await state.reserve("a", 10)
    keep = await state.reserve("a", 5)
    await state.release(r)
    await state.release(r)
    await state.release(Reservation(id="never-issued", backend="a", tokens=999))
    a = view(state, "a")
    assert (a.inflight_requests, a.inflight_tokens) == (1, 5)
    await state.release(keep)
    await state.release(keep)
    a = view(state, "a")
    assert (a.inflight_requests, a.inflight_tokens) == (0, 0)


async def test_negative_tokens_are_clamped(state: FleetState) -> None:
    r = await state.reserve("a", -5)
    assert view(state, "a").inflight_tokens == 0
    await state.release(r)
    assert view(state, "a").inflight_tokens == 0


async def test_unknown_backend_is_rejected(state: FleetState) -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        await state.reserve("zzz", 1)
    with pytest.raises(ValueError, match="unknown backend"):
        await state.record_probe("zzz", True, None)


async def test_ejected_after_n_failed_probes(state: FleetState) -> None:
    for i in range(1, 3):
        await state.record_probe("a", False, None)
        assert view(state, "a").healthy and view(state, "a").consecutive_failures == i
    await state.record_probe("a", False, None)
    assert not view(state, "a").healthy
    assert view(state, "b").healthy
    assert not state.any_probe_ok()


async def test_ejected_after_n_failed_requests(state: FleetState) -> None:
    for _ in range(3):
        await state.record_result("b", False)
    assert not view(state, "b").healthy and view(state, "b").consecutive_failures == 3


async def test_probe_and_request_failures_count_together(state: FleetState) -> None:
    await state.record_probe("a", False, None)
    await state.record_result("a", False)
    assert view(state, "a").healthy
    await state.record_result("a", False)
    assert not view(state, "a").healthy


async def test_a_success_resets_the_failure_run(state: FleetState) -> None:
    await state.record_probe("a", False, None)
    await state.record_probe("a", False, None)
    await state.record_result("a", True)
    assert view(state, "a").consecutive_failures == 0
    await state.record_probe("a", False, None)
    await state.record_result("a", False)
    assert view(state, "a").healthy
    await state.record_probe("a", True, None)
    await state.record_probe("a", False, None)
    await state.record_probe("a", False, None)
    assert view(state, "a").healthy


async def test_readmitted_after_m_good_probes_only(state: FleetState) -> None:
    for _ in range(3):
        await state.record_probe("a", False, None)
    assert not view(state, "a").healthy
    await state.record_result("a", True)  # a late request's success does not re-admit
    assert not view(state, "a").healthy
    await state.record_probe("a", True, None)
    assert not view(state, "a").healthy  # readmit_after_successes=2
    await state.record_probe("a", False, None)  # breaks the run
    await state.record_probe("a", True, None)
    assert not view(state, "a").healthy
    await state.record_probe("a", True, None)
    assert view(state, "a").healthy and view(state, "a").consecutive_failures == 0
    assert state.any_probe_ok()


async def test_failure_on_probation_reejects_with_a_doubling_hold(state: FleetState, clock: FakeClock) -> None:
    """A worker whose probes pass while its requests fail (a half-broken engine) is not re-admitted
    every probe interval: re-ejected at its first failure after re-admission, it stays out 1 s, then 2 s."""
    for _ in range(3):
        await state.record_probe("a", False, None)
    for _ in range(2):
        await state.record_probe("a", True, None)
    assert view(state, "a").healthy  # re-admitted, on probation
    await state.record_result("a", False)  # one failure is enough now
    assert not view(state, "a").healthy
    for _ in range(3):
        await state.record_probe("a", True, None)
    assert not view(state, "a").healthy  # held for eject_backoff_s = 1 s
    clock.now += 1.0
    await state.record_probe("a", True, None)
    assert view(state, "a").healthy
    await state.record_result("a", False)
    clock.now += 1.5
    for _ in range(2):
        await state.record_probe("a", True, None)
    assert not view(state, "a").healthy  # the second repeat holds 2 s
    clock.now += 0.5
    await state.record_probe("a", True, None)
    assert view(state, "a").healthy
    await state.record_result("a", True)  # a served request ends probation and forgets the repeats
    await state.record_result("a", False)
    assert view(state, "a").healthy  # back to eject_after_failures=3


async def test_readmit_after_one_probe_by_default(make_state: StateFactory) -> None:
    st = await make_state(HealthConfig(eject_after_failures=1))
    await st.record_probe("a", False, None)
    assert not view(st, "a").healthy
    await st.record_probe("a", True, None)
    assert view(st, "a").healthy


async def test_scraped_metrics_and_their_age(state: FleetState, clock: FakeClock) -> None:
    m = ScrapedMetrics(running=4, waiting=2, kv_usage=0.5, preemptions_total=1.0)
    await state.record_probe("a", True, m)
    a = view(state, "a")
    assert (a.running, a.waiting, a.kv_usage, a.metrics_age_s, a.last_success_age_s) == (4, 2, 0.5, 0.0, 0.0)
    clock.now += 3.0
    await state.record_probe("a", True, None)  # /health ok, /metrics failed: keep the stale values
    a = view(state, "a")
    assert (a.running, a.kv_usage, a.metrics_age_s, a.last_success_age_s) == (4, 0.5, 3.0, 0.0)
    clock.now += 2.0
    a = view(state, "a")
    assert (a.metrics_age_s, a.last_success_age_s) == (5.0, 2.0)
    assert state.snapshot().taken_at == clock.now


async def test_last_success_age_from_requests(state: FleetState, clock: FakeClock) -> None:
    await state.record_result("b", True, ttft_s=0.1)
    clock.now += 1.5
    assert view(state, "b").last_success_age_s == 1.5
    assert not state.any_probe_ok()


async def test_latency_ewma(state: FleetState) -> None:
    await state.record_result("a", True, ttft_s=1.0, tpot_s=0.05)
    a = view(state, "a")
    assert (a.ttft_ewma_s, a.tpot_ewma_s) == (1.0, 0.05)
    await state.record_result("a", True, ttft_s=2.0)
    a = view(state, "a")
    assert a.ttft_ewma_s == pytest.approx(1.2) and a.tpot_ewma_s == 0.05
    await state.record_result("a", False, ttft_s=100.0)  # failures carry no timing
    await state.record_result("a", True, ttft_s=float("nan"), tpot_s=0.15)
    a = view(state, "a")
    assert a.ttft_ewma_s == pytest.approx(1.2) and a.tpot_ewma_s == pytest.approx(0.07)


async def test_prediction_bias_follows_observed_over_predicted(state: FleetState) -> None:
    import math

    from router.state.base import Feedback

    def fb(ttft: float | None, pttft: float | None, tpot: float | None, ptpot: float | None) -> Feedback:
        return Feedback(ttft, pttft, tpot, ptpot)

    a = view(state, "a")
    assert (a.ttft_bias, a.tpot_bias) == (1.0, 1.0)
    await state.record_result("a", True, ttft_s=0.2, tpot_s=0.02)  # no prediction: no bias
    assert (view(state, "a").ttft_bias, view(state, "a").tpot_bias) == (1.0, 1.0)
    await state.record_result("a", True, ttft_s=0.3, tpot_s=0.02, feedback=fb(0.2, 0.1, 0.02, 0.02))
    a = view(state, "a")
    assert a.ttft_bias == pytest.approx(math.exp(0.2 * math.log(2.0))) and a.tpot_bias == 1.0
    assert a.ttft_ewma_s == pytest.approx(0.22)  # the EWMAs keep the gateway's own TTFT
    for _ in range(60):  # a worker twice as slow as predicted, every time
        await state.record_result("a", True, feedback=fb(0.2, 0.1, 0.04, 0.02))
    a = view(state, "a")
    assert a.ttft_bias == pytest.approx(2.0, rel=1e-3) and a.tpot_bias == pytest.approx(2.0, rel=1e-3)
    assert view(state, "b").tpot_bias == 1.0  # per worker
    await state.record_result("a", False, feedback=fb(9.0, 0.1, None, None))  # failures carry no timing
    for bad in (fb(None, 0.1, 0.04, 0.0), fb(0.0, 0.1, 0.04, math.inf), fb(-1.0, 10.0, math.nan, 0.02)):
        await state.record_result("a", True, feedback=bad)  # nothing to compare: no change, no error
    assert view(state, "a").ttft_bias == pytest.approx(2.0, rel=1e-3)
    assert view(state, "a").tpot_bias == pytest.approx(2.0, rel=1e-3)
    for _ in range(200):  # one request counts as at most 4x; the view carries at most 2.5x
        await state.record_result("a", True, feedback=fb(100.0, 0.1, 1e-9, 0.02))
    a = view(state, "a")
    assert a.ttft_bias == pytest.approx(2.5) and a.tpot_bias == pytest.approx(1 / 2.5)


async def test_prediction_bias_fades_without_new_evidence(state: FleetState, clock: FakeClock) -> None:
    from router.state.base import Feedback
    from router.state.table import BIAS_HALF_LIFE_S

    for _ in range(60):
        await state.record_result("a", True, feedback=Feedback(None, None, 0.04, 0.02))
    assert view(state, "a").tpot_bias == pytest.approx(2.0, rel=1e-3)
    clock.now += BIAS_HALF_LIFE_S
    assert view(state, "a").tpot_bias == pytest.approx(2.0**0.5, rel=1e-3)  # half the log-ratio left
    await state.record_result("a", True, feedback=Feedback(None, None, 0.02, 0.02))  # the faded value is the start
    assert view(state, "a").tpot_bias == pytest.approx(2.0 ** (0.5 * 0.8), rel=1e-3)
    clock.now += 100 * BIAS_HALF_LIFE_S
    assert view(state, "a").tpot_bias == pytest.approx(1.0)


async def test_snapshot_is_frozen_and_eligible_filters(state: FleetState) -> None:
    from dataclasses import FrozenInstanceError

    from router.core.types import RequestFeatures

    snap = state.snapshot()
    with pytest.raises(FrozenInstanceError):
        snap.backends[0].healthy = False  # type: ignore[misc]
    for _ in range(3):
        await state.record_probe("a", False, None)
    f = RequestFeatures(
        agent="x", endpoint="chat", models=("m1", "m2"), prompt_tokens=10, max_tokens=None, stream=False
    )
    assert [b.name for b in state.snapshot().eligible(f).backends] == ["b"]
    assert snap.backends[0].healthy  # an earlier snapshot does not change under the caller


def _config(state: str) -> Config:
    return Config.model_validate(
        {
            "gateway": {"state": state},
            "backends": [{"name": "a", "url": "http://127.0.0.1:9001", "model": "m", "kv_budget_tokens": 10}],
            "agents": [{"name": "x", "models": ["m"]}],
        }
    )


def test_create_state_picks_by_name() -> None:
    st = create_state(_config("memory"))
    assert isinstance(st, MemoryFleetState) and st.kind == "memory"
    assert [b.name for b in st.snapshot().backends] == ["a"]


def test_create_state_redis_reads_its_options_from_the_url() -> None:
    st = create_state(_config("redis://127.0.0.1:6379/3?prefix=p1&lease_ttl_s=2.5&replica=r1&health_check_interval=5"))
    assert isinstance(st, RedisFleetState) and st.kind == "redis" and st.replica_id == "r1"
    assert st._opts == RedisOptions("redis://127.0.0.1:6379/3?health_check_interval=5", prefix="p1", lease_ttl_s=2.5,
                                    replica_id="r1")  # fmt: skip
    with pytest.raises(ConfigError, match="lease_ttl_s='x'") as ei:  # (a config with it does not load)
        redis_options("redis://127.0.0.1:6379/0?lease_ttl_s=x")
    assert ei.value.key == "gateway.state"


@pytest.mark.parametrize(
    ("url", "sentinels", "service", "master"),
    [
        ("redis+sentinel://s1:26380,s2/main?prefix=p", (("s1", 26380), ("s2", 26379)), "main",
         "redis://sentinel-master/0"),
        ("rediss+sentinel://u:pw@[::1]:5000/main/4?sentinel_password=sp&ssl_cert_reqs=none", (("::1", 5000),), "main",
         "rediss://u:pw@sentinel-master/4?ssl_cert_reqs=none"),
    ],
)  # fmt: skip
def test_a_sentinel_url_names_the_sentinels_the_service_and_the_master(
    url: str, sentinels: tuple[tuple[str, int], ...], service: str, master: str
) -> None:
    st = create_state(_config(url))
    assert isinstance(st, RedisFleetState)
    assert (st._opts.sentinels, st._opts.service, st._opts.url) == (sentinels, service, master)
    assert st._opts.sentinel_password == ("sp" if "sentinel_password" in url else None)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://s1:x/main", "not a Sentinel's HOST:PORT"),
        ("redis+sentinel://s1/", "ends in /SERVICE or /SERVICE/DB"),
        ("redis+sentinel://s1/main/x", "ends in /SERVICE or /SERVICE/DB"),
        ("redis://h:1/0?sentinel_password=a", "sentinel_password is for redis\\+sentinel"),
        ("redis+sentinel://s1/main?prefx=1", "unknown key 'prefx'"),
    ],
)
def test_a_bad_sentinel_url_is_a_config_error(url: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _config(url)


async def test_memory_views_are_cached_until_a_change_or_a_tick(clock: FakeClock) -> None:
    # Implementation detail of MemoryFleetState (snapshot() is on the hot path), not of the Protocol.
    st = MemoryFleetState(BACKENDS, HEALTH, clock=clock)
    s1 = st.snapshot()
    assert st.snapshot().backends is s1.backends
    await st.reserve("a", 1)
    s2 = st.snapshot()
    assert s2.backends[0].inflight_requests == 1 and s2.backends[0] is not s1.backends[0]
    assert s2.backends[1] is s1.backends[1]
    await st.record_probe("b", True, None)
    assert st.snapshot().backends[1].last_success_age_s == 0.0
    clock.now += 0.01
    assert st.snapshot().backends[1].last_success_age_s == 0.0  # within AGE_RESOLUTION_S
    clock.now += 1.0
    assert st.snapshot().backends[1].last_success_age_s == pytest.approx(1.01)
