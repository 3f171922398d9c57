"""Listening sockets bound before uvicorn starts (``uvicorn.Server(config).run(sockets=...)``), and the two
helpers of whoever starts a server process: :func:`free_port` and :func:`wait_ready`.

uvicorn binds its own socket only once the app is built and then reports a taken port as a log line
and exit status 3; binding first turns it into one :class:`ChimeraError` line,
``cannot listen on 127.0.0.1:8080: address already in use``, raised before anything else starts.
"""

from __future__ import annotations

import errno
import random
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.core.errors import ChimeraError

if TYPE_CHECKING:
    import httpx

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


#: where :func:`free_port` looks: below Linux's default range of ports for outgoing connections (32768-60999), so a
#: port handed out is not also the local end of a client's connection (a load client's, a router's) by the time
#: the server binds it
FREE_PORTS = range(20000, 32768)
_handed_out: set[int] = set()
_draw = random.SystemRandom()  # not the seeded module state: forked processes draw differently


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``host`` now, outside the range the kernel takes ports for outgoing
    connections from, and not handed out before by this process (another process may take it before the caller
    binds it: bind it soon)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(64):
        port = _draw.randrange(FREE_PORTS.start, FREE_PORTS.stop)
        if port in _handed_out:
            continue
        with socket.socket(family) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(family) as s:  # the range is crowded: whatever the kernel picks
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout_s: float = 30.0, *, proc: subprocess.Popen[Any] | None = None,
               log_file: Path | None = None, poll_s: float = 0.1) -> None:  # fmt: skip
    """GET ``url`` (e.g. ``http://127.0.0.1:8080/ready``) until it answers 2xx. Raises :class:`ChimeraError`
    when ``proc`` (the server's process, if given) exits first, with the last line of its ``log_file`` (the
    cause), or when ``timeout_s`` passes, with the last answer (a gateway's ``/ready`` says why it is not)."""
    import httpx  # here: the servers that import this module for listen() need no client

    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        if proc is not None and proc.poll() is not None:
            cause = _last_line(log_file)
            raise ChimeraError(f"the server process for {url} exited with status {proc.returncode}"
                               + (f": {cause}" if cause else ""))  # fmt: skip
        try:
            r = httpx.get(url, timeout=1.0)
            if r.is_success:
                return
            last = _said(r)
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise ChimeraError(f"{url} did not answer within {timeout_s:g} s" + (f": {last}" if last else ""))
        time.sleep(poll_s)


def _said(r: httpx.Response) -> str:
    """An answer in a few words: its status and an OpenAI envelope's message."""
    try:
        message = r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = ""
    return f"{r.status_code} {message}".strip()


def _last_line(log_file: Path | None) -> str:
    if log_file is None:
        return ""
    try:
        lines = [ln.strip() for ln in log_file.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""
