"""What the attack tests share: a real `chimera serve` in a process of its own (so its memory is its own), its RSS,
and a raw request head sent as fast as the gateway reads it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from backends.listen import wait_ready
from tests.conftest import interrupt

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def chimera_serve(cfg: Path, port: int, *, ready: str = "/ready", out: Path | None = None,
                  env: Mapping[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:  # fmt: skip
    """``chimera serve --config cfg`` (listening on ``port``) until the block ends, once ``ready`` answers: its URL
    and process. ``out``: where its output goes (else nowhere); ``env``: its environment (else this one's)."""
    with contextlib.ExitStack() as files:
        sink = files.enter_context(out.open("wb")) if out is not None else subprocess.DEVNULL
        proc = subprocess.Popen([sys.executable, "-m", "router.cli", "serve", "--config", str(cfg)], cwd=ROOT,
                                stdout=sink, stderr=subprocess.STDOUT if out is not None else subprocess.DEVNULL,
                                env=env)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + ready, 40, proc=proc)
        yield url, proc
    finally:
        interrupt(proc)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def send_raw(url: str, head: bytes, chunk: int = 1 << 16, total: int = 0) -> bytes:
    """Send ``head`` then ``total`` bytes of one header's value in ``chunk``-sized writes, as fast as the gateway
    reads them; what the gateway answered (it may close the connection before all is sent)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        try:
            s.sendall(head)
            sent = 0
            while sent < total:
                s.sendall(b"a" * min(chunk, total - sent))
                sent += chunk
            s.sendall(b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us: the answer is read below
        answer = b""
        try:
            while data := s.recv(65536):
                answer += data
        except ConnectionResetError:
            pass
        return answer
