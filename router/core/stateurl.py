"""Options of the Redis fleet state, read from its URL (``gateway.state``) without importing redis.

``redis://`` / ``rediss://`` (TLS) / ``unix://`` name one server. ``redis+sentinel://`` and ``rediss+sentinel://`` name
the Sentinels that know where the master is, ``[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``: the state
asks them for the master of SERVICE on every new connection, so a failover is followed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

from router.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RedisOptions:
    url: str  # what redis-py connects to (our own query keys removed)
    prefix: str = "chimera"  # key prefix: replicas sharing a fleet view name the same one
    replica_id: str | None = None  # default: host-pid-random, unique per process start
    lease_ttl_s: float = 10.0  # a replica that stops heartbeating loses its reservations after this
    sync_interval_s: float = 0.1  # heartbeat + refresh of the local view
    op_timeout_s: float = 0.1  # the longest a Redis round trip may hold a request
    sentinels: tuple[tuple[str, int], ...] = ()  # redis+sentinel://: the Sentinels to ask for the master
    service: str = ""  # the master's name at the Sentinels
    sentinel_password: str | None = None  # the Sentinels' own password (the URL's is the master's)


SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SENTINEL_PORT = 26379


#: The state URL's own query keys: the RedisOptions field each sets, its type, and what it does (the configuration
#: reference's table, router/reference.py). Every other query key is redis-py's.
STATE_KEYS: dict[str, tuple[str, type[str] | type[float], str]] = {
    "prefix": ("prefix", str, "Key prefix in Redis: the gateway replicas that share one fleet view name the same "
                              "one; another prefix is another fleet on the same Redis."),
    "replica": ("replica_id", str, "This replica's id in the shared state (default: host-pid-random, new at every "
                                   "start)."),
    "lease_ttl_s": ("lease_ttl_s", float, "Seconds after which a replica that stopped heartbeating loses its "
                                          "reservations (a crashed replica's load expires)."),
    "sync_interval_s": ("sync_interval_s", float, "Seconds between a replica's heartbeat and refresh of its "
                                                  "local view of the fleet."),
    "op_timeout_s": ("op_timeout_s", float, "The longest a Redis round trip may hold a request, in seconds; past it "
                                            "the state serves on its local view (degraded) until Redis answers."),
    "sentinel_password": ("sentinel_password", str, "`redis+sentinel://` only: the Sentinels' own password (the "
                                                    "URL's user and password are the master's)."),
}  # fmt: skip
_KEYS = {k: (field, kind) for k, (field, kind, _) in STATE_KEYS.items()}


def redacted(url: str) -> str:
    """``url`` fit for a log line or a terminal: its password (``user:PASSWORD@``) and every query value whose key
    names a password (``sentinel_password=``) shown as ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password:
        netloc = netloc.replace(":" + parts.password + "@", ":***@", 1)
    query = parts.query
    if "password" in query:
        query = urlencode([(k, "***" if "password" in k else v) for k, v in parse_qsl(query, keep_blank_values=True)],
                          safe="*")  # fmt: skip
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def redis_options(url: str) -> RedisOptions:
    """``redis://HOST:PORT/DB?prefix=P&lease_ttl_s=10&...``: query keys the state does not know
    are left in the URL for redis-py. A Sentinel URL's hosts and service go to ``sentinels`` and ``service``; its
    ``url`` is then the master's ``redis://`` (or ``rediss://``) URL with a placeholder host."""
    parts = urlsplit(url)
    ours: dict[str, Any] = {}
    if parts.scheme in SENTINEL_SCHEMES:
        ours["sentinels"], ours["service"], parts = _sentinel(parts)
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query):
        if key not in _KEYS:
            rest.append((key, value))
            continue
        field, kind = _KEYS[key]
        try:
            ours[field] = kind(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r} in the state URL is not a number", key="gateway.state") from None
        if key == "sentinel_password" and "sentinels" not in ours:
            raise ConfigError("sentinel_password is for redis+sentinel:// URLs", key="gateway.state")
        if kind is float and not ours[field] > 0:
            raise ConfigError(f"{key} in the state URL must be positive", key="gateway.state")
    return RedisOptions(url=urlunsplit(parts._replace(query=urlencode(rest))), **ours)


def _sentinel(parts: SplitResult) -> tuple[tuple[tuple[str, int], ...], str, SplitResult]:
    userinfo, _, hosts = parts.netloc.rpartition("@")
    sentinels = []
    for item in hosts.split(","):
        host, sep, port = item.rpartition(":") if not item.endswith("]") else (item, "", "")
        if not sep:
            host, port = item, str(SENTINEL_PORT)
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{item!r} in the state URL is not a Sentinel's HOST:PORT", key="gateway.state")
        sentinels.append((host, int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not 1 <= len(path) <= 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigError("a Sentinel state URL ends in /SERVICE or /SERVICE/DB "
                          "(redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB])", key="gateway.state")  # fmt: skip
    scheme = "rediss" if parts.scheme.startswith("rediss") else "redis"
    master = parts._replace(scheme=scheme, netloc=(userinfo + "@" if userinfo else "") + "sentinel-master",
                            path="/" + (path[1] if len(path) == 2 else "0"))  # fmt: skip
    return tuple(sentinels), path[0], master


def check_redis_url(url: str) -> RedisOptions:
    """:func:`redis_options`, and redis-py's own reading of the rest of the URL (its host, port, database and
    query keys: a typo such as ``?prefx=a`` would otherwise fail only when the gateway starts). Builds a
    connection object without connecting. Raises ConfigError."""
    options = redis_options(url)
    import redis.asyncio

    try:
        redis.asyncio.ConnectionPool.from_url(options.url).make_connection()  # type: ignore[no-untyped-call]
    except TypeError as exc:  # redis-py passes unknown query keys on to its connection class
        unknown = re.search(r"keyword argument '([^']+)'", str(exc))
        what = f"unknown key {unknown.group(1)!r}" if unknown else str(exc)
        raise ConfigError(f"{what} in the state URL (ours: {', '.join(_KEYS)}; else redis-py's)",
                          key="gateway.state") from None  # fmt: skip
    except ValueError as exc:
        raise ConfigError(f"state URL: {exc}", key="gateway.state") from None
    return options
