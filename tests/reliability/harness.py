"""What the fault tests share: real `chimera sim` worker processes, a closed-loop load that counts
how every request ended, and workers that misbehave on cue.

Every request of a load ends as exactly one :class:`Outcome` kind:

    ok           200 with a whole answer (a stream ends with ``data: [DONE]``)
    error_event  a stream that broke mid-way and ended with an SSE error event (the contract)
    error        an HTTP error status in OpenAI's envelope
    lost         anything else: a transport error, a stream cut without an error event, a body
                 that is neither an answer nor the envelope
    hung         not finished within the bound
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from backends.listen import free_port, wait_ready
from tests.e2e.fakes import FakeWorker, Receive, Scope, Send, _respond

SIM_MODEL = "qwen2.5-0.5b"


class SimProcess:
    """`chimera sim` in a subprocess (so SIGKILL is a real process death)."""

    def __init__(self, *, speedup: float = 2.0, model: str = SIM_MODEL, seed: int = 0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "router.cli", "sim", "--port", str(self.port), "--model", model,
               "--profile", "h200-qwen2.5-0.5b", "--speedup", str(speedup), "--seed", str(seed)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=os.getcwd())

    def wait_healthy(self, timeout: float = 20.0) -> SimProcess:
        wait_ready(self.url + "/health", timeout, proc=self.proc, poll_s=0.05)
        return self

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@contextlib.contextmanager
def sims(n: int, **kwargs: Any) -> Iterator[list[SimProcess]]:
    procs = [SimProcess(seed=i, **kwargs) for i in range(n)]  # start together, wait together
    try:
        yield [p.wait_healthy() for p in procs]
    finally:
        for p in procs:
            p.kill()


# -- load ----------------------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str
    status: int | None = None
    backend: str | None = None
    attempts: int = 0
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)

    def kinds(self) -> Counter[str]:
        return Counter(o.kind for o in self.outcomes)

    @property
    def hung(self) -> int:
        return self.kinds()["hung"]

    @property
    def lost(self) -> int:
        return self.kinds()["lost"]

    def retried(self) -> int:
        return sum(1 for o in self.outcomes if o.attempts > 1)

    def slowest(self) -> float:
        return max((o.seconds for o in self.outcomes), default=0.0)

    def summary(self) -> str:
        kinds = dict(sorted(self.kinds().items()))
        return f"{len(self.outcomes)} requests {kinds}, retried {self.retried()}, slowest {self.slowest():.2f}s"


def completion_body(i: int, *, stream: bool, output_tokens: int = 64, model: str = "auto") -> dict[str, Any]:
    return {"model": model, "stream": stream, "max_tokens": output_tokens, "sim": {"output_tokens": output_tokens},
            "messages": [{"role": "user", "content": f"request {i}: say something long"}]}  # fmt: skip


def _is_envelope(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("error"), dict) and {"message", "type"} <= set(data["error"])


def classify_stream(status: int, text: str) -> tuple[str, str]:
    if status != 200:
        try:
            return ("error", "") if _is_envelope(json.loads(text)) else ("lost", text[:200])
        except ValueError:
            return "lost", text[:200]
    if text.endswith("data: [DONE]\n\n"):
        return "ok", ""
    last = text.strip().split("\n\n")[-1] if text.strip() else ""
    if last.startswith("data: ") and text.endswith("\n\n"):
        try:
            if _is_envelope(json.loads(last[6:])):
                return "error_event", ""
        except ValueError:
            pass
    return "lost", f"stream cut: ...{text[-160:]!r}"


async def one_request(client: httpx.AsyncClient, url: str, body: dict[str, Any], bound: float,
                      headers: dict[str, str] | None = None) -> Outcome:  # fmt: skip
    t0 = time.monotonic()
    out = Outcome("hung")
    try:
        async with asyncio.timeout(bound):
            if body.get("stream"):
                async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
                    text = (await r.aread()).decode()
                out.kind, out.detail = classify_stream(r.status_code, text)
            else:
                r = await client.post(url + "/v1/chat/completions", json=body, headers=headers)
                data = r.json()
                ok = r.status_code == 200 and isinstance(data.get("choices"), list)
                out.kind = "ok" if ok else "error" if r.status_code >= 400 and _is_envelope(data) else "lost"
            out.status = r.status_code
            out.backend = r.headers.get("x-chimera-backend")
            out.attempts = int(r.headers.get("x-chimera-attempts", "0"))
    except TimeoutError:
        out.kind = "hung"
    except (httpx.HTTPError, ValueError) as exc:
        out.kind, out.detail = "lost", f"{type(exc).__name__}: {exc}"
    out.seconds = time.monotonic() - t0
    return out


async def closed_loop(url: str, *, total: int, concurrency: int, bound: float, stream_share: float = 0.5,
                      output_tokens: int = 64, headers: dict[str, str] | None = None,
                      on_progress: Callable[[int], None] | None = None) -> Tally:  # fmt: skip
    """``total`` requests, ``concurrency`` at a time; every ``1/stream_share``-th one streamed."""
    tally = Tally()
    queue = iter(range(total))
    every = max(1, round(1 / stream_share)) if stream_share > 0 else 0
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)

    async def lane(client: httpx.AsyncClient) -> None:
        for i in queue:
            body = completion_body(i, stream=bool(every) and i % every == 0, output_tokens=output_tokens)
            tally.outcomes.append(await one_request(client, url, body, bound, headers))
            if on_progress is not None:
                on_progress(len(tally.outcomes))

    async with httpx.AsyncClient(timeout=bound + 5, limits=limits) as client:
        await asyncio.gather(*(lane(client) for _ in range(concurrency)))
    return tally


# -- fleet ---------------------------------------------------------------------------------------


def fleet(url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return httpx.get(url + "/fleet", timeout=2, headers=headers).json()  # type: ignore[no-any-return]


def backend_view(url: str, name: str) -> dict[str, Any]:
    return next(b for b in fleet(url)["backends"] if b["name"] == name)


async def until(cond: Callable[[], bool], within: float, step: float = 0.02) -> float:
    """Seconds until ``cond()`` held (asserting it did within ``within``); polls off the loop."""
    t0 = time.monotonic()
    while not await asyncio.to_thread(cond):
        assert time.monotonic() - t0 < within, f"condition not met within {within}s"
        await asyncio.sleep(step)
    return time.monotonic() - t0


# -- workers that misbehave on cue ---------------------------------------------------------------


@dataclass
class SwitchableWorker(FakeWorker):
    """A FakeWorker whose /health follows its mode, as vLLM's does when its engine is dead: in
    ``status`` or ``garbage`` mode /health answers 500; set ``mode = "ok"`` and it recovers."""

    health_follows_mode: bool = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sick = self.mode in ("status", "garbage")
        if scope["type"] == "http" and scope["path"] == "/health" and sick and self.health_follows_mode:
            await _respond(send, 500, b'{"error": "engine dead"}')
            return
        await super().__call__(scope, receive, send)


class Blackhole:
    """A TCP server that accepts connections and never reads or writes a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.accepted: list[Any] = []
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted.append(conn)

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        for c in self.accepted:
            c.close()
        self.sock.close()
