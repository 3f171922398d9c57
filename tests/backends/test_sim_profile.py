"""Profiles and settings: what ships parses, what is wrong is refused in one line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from backends.sim.profile import STEP_FEATURES, ProfileError, available_profiles, load_profile
from backends.sim.server import SimSettings, create_app


def test_shipped_profiles_parse() -> None:
    names = available_profiles()
    assert {"h200-qwen2.5-0.5b", "h200-qwen2.5-1.5b", "h200-qwen2.5-7b", "h200-qwen2.5-14b"} <= set(names)
    for name in names:
        p = load_profile(name)
        assert p.name == name and 0.0 <= p.quality <= 1.0 and p.kv_budget_tokens >= p.block_size
        assert p.provenance.get("status") in ("measured", "provisional")


def test_unknown_step_feature_is_refused(sim_profile: Callable[..., str], tmp_path: Path) -> None:
    data = json.loads(Path(sim_profile()).read_text())
    data["step_time_s"]["warp_speed"] = 1.0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="warp_speed"):
        load_profile(str(path))
    assert "warp_speed" not in STEP_FEATURES


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (SimSettings(profile="no-such-gpu"), "unknown profile"),
        (SimSettings(kv_tokens=-5), "kv_tokens"),
        (SimSettings(kv_tokens=3), "at least one block"),
        (SimSettings(speedup=0.0), "speedup"),
        (SimSettings(speedup=-1.0), "speedup"),
        (SimSettings(seed=-1), "seed"),
        (SimSettings(max_num_seqs=0), "max_num_seqs"),
        (SimSettings(max_num_batched_tokens=-1), "max_num_batched_tokens"),
    ],
)
def test_bad_settings_raise_profile_error(settings: SimSettings, match: str) -> None:
    with pytest.raises(ProfileError, match=match) as info:
        create_app(settings)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)
