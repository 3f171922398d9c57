"""How the Redis fleet state connects through Sentinel (``redis+sentinel://`` URLs, :mod:`router.core.stateurl`): the
master's connection options, and the Sentinels asked for it."""

from __future__ import annotations

from typing import Any

from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.sentinel import Sentinel

from router.core.stateurl import RedisOptions


def master_kwargs(url: str) -> dict[str, Any]:
    """The master connections' options from a Sentinel URL's master part (``redis_options``): its user, password,
    database and redis-py query keys; TLS where the scheme was ``rediss+sentinel``."""
    kwargs: dict[str, Any] = dict(parse_url(url))
    kwargs.pop("host", None)
    kwargs.pop("port", None)
    if kwargs.pop("connection_class", None) is SSLConnection:
        kwargs["ssl"] = True
    return kwargs


def sentinels(opts: RedisOptions) -> Sentinel:
    """The Sentinels of a ``redis+sentinel://`` state, asked with the same timeouts as the master (and over TLS with
    the same certificates where the master is)."""
    master = master_kwargs(opts.url)
    kwargs: dict[str, Any] = {"socket_timeout": opts.op_timeout_s, "socket_connect_timeout": opts.op_timeout_s,
                              "password": opts.sentinel_password}  # fmt: skip
    if master.get("ssl"):
        kwargs.update({k: v for k, v in master.items() if k.startswith("ssl")})
    return Sentinel(opts.sentinels, sentinel_kwargs=kwargs)
