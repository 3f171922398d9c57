"""Profiles and settings: what ships parses, what is wrong is refused in one line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from backends.sim.server import SimSettings, create_app
from router.core.errors import ChimeraError, ProfileError
from router.core.profile import STEP_FEATURES, available_profiles, load_profile, parse_profile


def test_shipped_profiles_parse() -> None:
    names = available_profiles()
    assert {"h200-qwen2.5-0.5b", "h200-qwen2.5-1.5b", "h200-qwen2.5-7b", "h200-qwen2.5-14b"} <= set(names)
    for name in names:
        p = load_profile(name)
        assert p.name == name and 0.0 <= p.quality <= 1.0 and p.kv_budget_tokens >= p.block_size
        assert p.provenance.get("status") in ("measured", "provisional")


def test_ttft_jitter_defaults_to_none_and_is_bounded_by_the_constant(sim_profile: Callable[..., str]) -> None:
    data = json.loads(Path(sim_profile()).read_text())
    assert parse_profile(data).ttft_jitter_s == 0.0  # the shipped behaviour: deterministic
    data["overhead_s"] = {"ttft": 0.01, "ttft_jitter": 0.02}
    assert parse_profile(data).ttft_jitter_s == 0.02
    data["overhead_s"]["ttft_jitter"] = 0.03  # more than twice the constant: a first token before its time
    with pytest.raises(ProfileError, match="ttft_jitter"):
        parse_profile(data)


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
    assert isinstance(info.value, ChimeraError) and "\n" not in str(info.value)


def test_old_profiles_without_the_new_terms_still_load(sim_profile: Callable[..., str]) -> None:
    p = load_profile(sim_profile())
    assert p.cudagraph is None and p.frontend is None
    assert p.gpu_share == 1.0  # all GPU work, as before the co-location probe


def test_shipped_profiles_carry_the_cliff_and_the_front_end() -> None:
    for name in ("h200-qwen2.5-0.5b", "h200-qwen2.5-7b"):
        p = load_profile(name)
        assert p.cudagraph is not None and p.cudagraph.max_tokens == 128
        assert p.frontend is not None and p.frontend.per_prompt_token > 0
        assert 0.0 < p.gpu_share <= 1.0 and "gpu_share" in p.provenance


@pytest.mark.parametrize(
    ("section", "value", "match"),
    [
        ("cudagraph", {"max_tokens": 128, "eager_warp": 1.0}, "eager_warp"),
        ("cudagraph", {"eager_extra_s": 0.01}, "cudagraph.max_tokens"),
        ("cudagraph", {"max_tokens": 0}, "cudagraph.max_tokens"),
        ("cudagraph", {"max_tokens": 128, "eager_floor_s": -1}, "eager_floor_s"),
        ("cudagraph", {"max_tokens": 128, "eager_extra_decode_only": "yes"}, "eager_extra_decode_only"),
        ("frontend_s", {"per_token": 1e-6}, "per_token"),
        ("frontend_s", {"per_request": "fast"}, "per_request"),
        ("overhead_s", {"tpot": 0.1}, "tpot"),
        ("gpu_share", 1.5, "gpu_share"),
        ("gpu_share", -0.1, "gpu_share"),
        ("gpu_share", "half", "gpu_share"),
        ("tokenizer", {"kind": "bpe"}, "tokenizer.kind"),
        ("async_scheduling", "yes", "async_scheduling"),
        ("tokenizer", {"kind": "wordlevel", "vocab_size": 0}, "tokenizer.vocab_size"),
        ("tokenizer", {"kind": "wordlevel", "merges": []}, "merges"),
    ],
)
def test_bad_new_sections_are_refused(
    sim_profile: Callable[..., str], tmp_path: Path, section: str, value: object, match: str
) -> None:
    data = json.loads(Path(sim_profile()).read_text())
    data[section] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=match) as info:
        load_profile(str(path))
    assert "\n" not in str(info.value)


def test_tokenizer_defaults_to_words_and_reads_wordlevel(sim_profile: Callable[..., str]) -> None:
    assert load_profile(sim_profile()).tokenizer.kind == "words"
    tok = load_profile(sim_profile(tokenizer={"kind": "wordlevel", "vocab_size": 1000})).tokenizer
    assert (tok.kind, tok.vocab_size) == ("wordlevel", 1000)
