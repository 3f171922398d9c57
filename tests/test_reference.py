"""docs/configuration.md is generated from the config models; it must be what they generate now."""

from __future__ import annotations

from pathlib import Path

from router.core import config
from router.reference import SECTIONS, render

ROOT = Path(__file__).resolve().parents[1]


def test_the_configuration_reference_matches_the_models() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == render(), "docs/configuration.md is stale: python -m router.reference > docs/configuration.md"


def test_every_model_and_every_key_is_documented() -> None:
    models = {m for _, _, m in SECTIONS}
    every = {v for v in vars(config).values() if isinstance(v, type) and issubclass(v, config._Frozen)}
    assert every - {config._Frozen} == models  # a new section of the config gets a section of the page
    undocumented = [f"{m.__name__}.{k}" for m in models for k, f in m.model_fields.items() if not f.description]
    assert undocumented == []
