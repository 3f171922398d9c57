"""Routing policies, picked by name: ``get_policy(name, options)`` → a pure ``Policy``.

A policy is ``choose(features, snapshot) -> Decision`` where ``snapshot`` holds only the workers
eligible for the request (healthy, serving an allowed model, context long enough); it never does
I/O and never sees the HTTP request.
"""

from __future__ import annotations

from collections.abc import Callable

from router.config import PolicyOptions
from router.errors import ConfigError
from router.policies import basic
from router.types import Policy

PolicyFactory = Callable[[PolicyOptions], Policy]

_REGISTRY: dict[str, PolicyFactory] = {
    "round_robin": lambda _opts: basic.round_robin,
    "least_outstanding": lambda _opts: basic.least_outstanding,
    "least_kv": lambda _opts: basic.least_kv,
    "length_split": basic.make_length_split,
    "predictive": lambda opts: _predictive(opts),
}


def _predictive(options: PolicyOptions) -> Policy:
    # Imported on demand: the predictor brings scikit-learn, which the other policies do not need.
    # Built this way it routes on the analytic prior with profiles guessed from model names;
    # create_app builds it with the config's profiles and the gateway's online-learning slot.
    from router.policies.predictive import make_predictive

    return make_predictive(options)


def available() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def get_policy(name: str, options: PolicyOptions | None = None) -> Policy:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown policy {name!r} (available: {', '.join(available())})", key="gateway.policy"
        ) from None
    return factory(options or PolicyOptions())
