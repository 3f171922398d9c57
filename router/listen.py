"""Listening sockets bound before uvicorn starts (``uvicorn.Server(config).run(sockets=...)``).

uvicorn binds its own socket only once the app is built and then reports a taken port as a log line
and exit status 3; binding first turns it into one :class:`ChimeraError` line,
``cannot listen on 127.0.0.1:8080: address already in use``, raised before anything else starts.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence

from router.errors import ChimeraError

BACKLOG = 2048  # uvicorn's default


def where(host: str, port: int) -> str:
    """``host:port`` as a URL writes it (``[::1]:8080``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen(endpoints: Sequence[tuple[str, int]]) -> list[socket.socket]:
    """Listening TCP sockets on every ``(host, port)``: one per address a host name resolves to, as
    asyncio's ``create_server`` binds them (so ``localhost`` is 127.0.0.1 and ::1), with SO_REUSEADDR
    (a restart does not wait out TIME_WAIT). Raises :class:`ChimeraError` naming the first endpoint
    that cannot be bound, having closed the sockets already bound."""
    sockets: list[socket.socket] = []
    try:
        for host, port in endpoints:
            sockets += _listen_one(host, port)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def check_free(host: str, port: int) -> None:
    """Raise :class:`ChimeraError` when ``host:port`` cannot be listened on now (another process holds it)."""
    for sock in listen([(host, port)]):
        sock.close()


def _listen_one(host: str, port: int) -> list[socket.socket]:
    if not 0 <= port <= 65535:
        raise ChimeraError(f"cannot listen on {where(host, port)}: the port must be 0..65535")
    sockets: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # else it takes the IPv4 port too, which the next socket binds
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL or len(infos) == 1:
                    raise
                sockets.pop().close()  # a family this machine has not enabled (as asyncio skips it)
                continue
            sock.listen(BACKLOG)
            sock.set_inheritable(True)  # for `--workers N`: uvicorn hands it to spawned processes
    except OSError as exc:
        for sock in sockets:
            sock.close()
        reason = exc.strerror or str(exc)
        raise ChimeraError(f"cannot listen on {where(host, port)}: {reason[:1].lower()}{reason[1:]}") from exc
    if not sockets:
        raise ChimeraError(f"cannot listen on {where(host, port)}: no usable address")
    return sockets
