"""Fleet state implementations, picked by name once at start-up: ``create_state(config)``.

``gateway.state`` is ``memory`` or a URL; the URL's scheme names the implementation. A new
implementation is one factory function and one registry entry.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from router.core.config import Config
from router.core.errors import ConfigError
from router.core.stateurl import redis_options
from router.state.base import FleetState, Reservation, ScrapedMetrics
from router.state.memory import MemoryFleetState

__all__ = ["FleetState", "MemoryFleetState", "Reservation", "ScrapedMetrics", "available", "create_state"]

StateFactory = Callable[[Config], FleetState]


def _memory(config: Config) -> FleetState:
    return MemoryFleetState(config.backends, config.gateway.health)


def _redis(config: Config) -> FleetState:
    # Imported here so a memory-only gateway never imports redis.
    from router.state.redis_state import RedisFleetState

    return RedisFleetState(config.backends, config.gateway.health, redis_options(config.gateway.state))


_REGISTRY: dict[str, StateFactory] = {
    "memory": _memory,
    "redis": _redis,
    "rediss": _redis,
    "unix": _redis,
    "redis+sentinel": _redis,
    "rediss+sentinel": _redis,
}


def available() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def create_state(config: Config) -> FleetState:
    """The FleetState ``config.gateway.state`` names (not started: the caller awaits ``start()``)."""
    spec = config.gateway.state
    name = spec if spec == "memory" else urlsplit(spec).scheme
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown state {spec!r} (available: {', '.join(available())})", key="gateway.state"
        ) from None
    return factory(config)
