"""Routing policies, picked by name once at start-up: ``create_policy(config, slot)`` → a pure ``Policy``.

A policy is ``choose(features, snapshot) -> Decision`` where ``snapshot`` holds only the workers
eligible for the request (healthy, serving an allowed model, context long enough); it never does
I/O and never sees the HTTP request.

The registry below is the one list of policy names: ``gateway.policy`` is checked against it
(``check_policy``) by ``chimera check`` and at start-up. A factory gets the whole config and the
gateway's online-learning slot (``None`` where the gateway keeps no predictor), so that whatever a
policy needs — its options, the workers' profiles — is resolved here, never during a decision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from router.core.config import Config
from router.core.types import Policy
from router.policies import basic

if TYPE_CHECKING:
    from predictor.model import ModelSlot

PolicyFactory = Callable[[Config, "ModelSlot | None"], Policy]


def _predictive(config: Config, slot: ModelSlot | None) -> Policy:
    # Imported on demand: the predictor brings scikit-learn, which the other policies do not need.
    # Without a slot it routes on the analytic prior; every backend's profile is resolved now.
    from predictor.prior import worker_profiles
    from router.policies.predictive import make_predictive

    live = slot.profiles if slot is not None else None  # kept up to date by the gateway's learner
    return make_predictive(config.gateway.policy_options, slot, live if live is not None else worker_profiles(config))


_REGISTRY: dict[str, PolicyFactory] = {
    "round_robin": lambda _config, _slot: basic.round_robin,
    "least_outstanding": lambda _config, _slot: basic.least_outstanding,
    "least_kv": lambda _config, _slot: basic.least_kv,
    "length_split": lambda config, _slot: basic.make_length_split(config.gateway.policy_options),
    "predictive": _predictive,
}

#: The policies that route on the predictor, so the gateway keeps one for them (router.learning).
USES_PREDICTOR = frozenset({"predictive"})

_PREDICTIVE_OPTIONS = ["latency_slack", "affinity_load_ratio", "affinity_load_slack"]
_PREDICTIVE_OPTIONS += ["wrong_answer_s", "wrong_answer_stage_s", "sla_miss_s", "latency_feedback", "spread_margin"]

#: The ``gateway.policy_options`` each policy reads (the others do nothing under it: router.checks).
OPTIONS_READ: dict[str, frozenset[str]] = {
    "length_split": frozenset({"long_prompt_tokens", "long_tag"}),
    "predictive": frozenset(_PREDICTIVE_OPTIONS),
}


def available() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def check_policy(config: Config) -> None:
    """ConfigError naming the file, line and key when ``gateway.policy`` is not a registered policy."""
    name = config.gateway.policy
    if name not in _REGISTRY:
        raise config.error(("gateway", "policy"), f"unknown policy {name!r} (available: {', '.join(available())})")


def create_policy(config: Config, slot: ModelSlot | None = None) -> Policy:
    """The policy ``gateway.policy`` names, built for this config. Raises ConfigError for an unknown name."""
    check_policy(config)
    return _REGISTRY[config.gateway.policy](config, slot)
