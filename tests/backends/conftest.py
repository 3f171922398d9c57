"""Fixtures of the simulated-worker tests: test profiles with round, exaggerated coefficients.

Tests never rely on the numbers of the shipped ``h200-*`` profiles (they are re-measured); physics
tests write their own profile JSON here and pass its path as ``profile``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backends.sim.engine import Engine
from router.core.profile import parse_profile

BASE_PROFILE: dict[str, Any] = {
    "name": "test",
    "model": "sim-test",
    "quality": 0.6,
    "kv_budget_tokens": 64_000,
    "block_size": 16,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 2048,
    "max_model_len": 8192,
    "step_time_s": {
        "base": 0.004,
        "prefill_tokens": 2e-5,
        "decode_seqs": 1e-4,
        "decode_context_tokens": 0.0,
        "prefill_attn_mtok2": 0.0,
    },
    "overhead_s": {"ttft": 0.0},
    "provenance": {"status": "test"},
    "raw": {},
}


def profile_dict(**overrides: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(BASE_PROFILE))
    for key, value in overrides.items():
        if key == "step_time_s":
            data[key].update(value)
        else:
            data[key] = value
    return data


@pytest.fixture
def sim_profile(tmp_path: Path) -> Callable[..., str]:
    """``sim_profile(kv_budget_tokens=..., step_time_s={...})`` → path of a profile JSON."""
    count = 0

    def write(**overrides: Any) -> str:
        nonlocal count
        count += 1
        path = tmp_path / f"profile-{count}.json"
        path.write_text(json.dumps(profile_dict(**overrides)))
        return str(path)

    return write


@pytest.fixture
def make_engine() -> Callable[..., Engine]:
    """``make_engine(kv_budget_tokens=..., step_time_s={...}, speedup=1.0)`` → an idle Engine."""

    def make(speedup: float = 1.0, seed: int = 0, scheduling_policy: str = "fcfs", **overrides: Any) -> Engine:
        profile = parse_profile(profile_dict(**overrides))
        return Engine(
            profile,
            kv_tokens=profile.kv_budget_tokens,
            max_num_seqs=profile.max_num_seqs,
            max_num_batched_tokens=profile.max_num_batched_tokens,
            speedup=speedup,
            seed=seed,
            scheduling_policy=scheduling_policy,
        )

    return make
