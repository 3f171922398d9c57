"""Shared fixtures: real uvicorn servers on loopback ports, simulated workers, gateways over them.

``ServerThread`` runs any ASGI app under a real ``uvicorn.Server`` in a background thread (its own
event loop), on a socket bound to a free loopback port, and stops it cleanly.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from chimera_bench import gateway_proc
from router.core.config import Config


def pytest_sessionstart(session: pytest.Session) -> None:
    """A run that includes the clients' tests (not only the quick ones) starts building their environments in the
    background now (tests/clients/conftest.py), once, in the process that runs or hands out the tests."""
    config = session.config
    if hasattr(config, "workerinput") or "not slow" in (config.option.markexpr or ""):
        return
    clients = ROOT / "tests" / "clients"
    paths = [Path(a.split("::")[0]).resolve() for a in config.args] or [ROOT / "tests"]
    if any(p == clients or clients in p.parents or p in clients.parents for p in paths):
        # niced: the tests come first, the builds take what is left; a failed build fails its test
        proc = subprocess.Popen([sys.executable, "-m", "tests.clients.conftest"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=lambda: os.nice(15))
        config.stash[_ENV_BUILD] = proc


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that run alone (``quiet``) first, while nothing else has started; then the slow ones, so that the
    workers (handed one test at a time: ``--maxschedchunk 1``) end together on short tests rather than one waiting
    on a long test at the end, the clients' last among them (their environments build meanwhile); then the rest."""
    clients = ROOT / "tests" / "clients"

    def key(item: pytest.Item) -> tuple[bool, bool, bool]:
        marked = item.get_closest_marker
        return marked("quiet") is None, marked("slow") is None, clients in item.path.parents

    items.sort(key=key)


@pytest.fixture(autouse=True)
def _quiet_when_timing(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under pytest-xdist the tests marked ``quiet`` (they measure wall-clock time against a tolerance) run first, one
    at a time, and no other test starts before the last of them has ended: a quiet test holds the run's lock file
    and adds a line to its tally when done; any other test waits for the tally to count every quiet test collected."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    base = Path(tempfile.gettempdir()) / f"chimera-tests-{run}"
    tally = Path(f"{base}.quiet")
    if request.node.get_closest_marker("quiet") is not None:
        with open(f"{base}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                with tally.open("a") as done:
                    done.write(request.node.nodeid + "\n")
        return
    deadline = time.monotonic() + 600  # (a quiet test that hangs is cut off by the time limit long before)
    quiet = request.config.stash.get(_QUIET, 0)
    while quiet and time.monotonic() < deadline:
        if tally.exists() and len(tally.read_text().splitlines()) >= quiet:
            break
        time.sleep(0.05)
    yield


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[_QUIET] = sum(item.get_closest_marker("quiet") is not None for item in session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    proc = session.config.stash.get(_ENV_BUILD, None)
    if proc is not None and proc.poll() is None:  # the run ended first (interrupted, or no client test ran)
        os.killpg(proc.pid, signal.SIGTERM)  # leave no pip behind (an environment not made whole is made again)
        proc.wait()


ROOT = Path(__file__).resolve().parents[1]
_ENV_BUILD = pytest.StashKey[subprocess.Popen[bytes]]()
_QUIET = pytest.StashKey[int]()  # how many quiet tests this run collected


def interrupt(proc: subprocess.Popen[Any], timeout_s: float = 15.0) -> None:
    """Stop a `chimera` process as Ctrl-C would, killing it if it has not ended within ``timeout_s``.
    SIGINT, not SIGTERM: uvicorn re-raises the signal it caught after its graceful shutdown, and a
    re-raised SIGTERM ends `chimera serve` before it stops its simulated workers."""
    gateway_proc.stop(proc, timeout_s, signal.SIGINT)


class ServerThread:
    """One ASGI app served by uvicorn on 127.0.0.1 in a daemon thread."""

    def __init__(
        self, app: Any, *, lifespan: str = "on", log_level: str = "error", http: Any = "auto", **config: Any
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, lifespan=lifespan, log_level=log_level, log_config=None, access_log=False, ws="none",
            timeout_graceful_shutdown=3, timeout_keep_alive=30, http=http, **config,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self, timeout: float = 10.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serve_asgi(app: Any, **kwargs: Any) -> Iterator[ServerThread]:
    with ServerThread(app, **kwargs) as srv:
        yield srv


def make_config(
    backends: list[dict[str, Any]],
    agents: list[dict[str, Any]] | None = None,
    **gateway: Any,
) -> Config:
    """A validated Config from plain dicts; backends need name, url and model at least."""
    bs = [{"kv_budget_tokens": 100_000, "max_model_len": 8192, **b} for b in backends]
    models = sorted({b["model"] for b in bs})
    data = {
        "gateway": {"policy": "round_robin", **gateway},
        "backends": bs,
        "agents": agents if agents is not None else [{"name": "chat", "models": models}],
    }
    if agents is None and "default_agent" not in data["gateway"]:
        data["gateway"]["default_agent"] = "chat"
    return Config.model_validate(data)


@pytest.fixture
def sim_server() -> Iterator[Callable[..., ServerThread]]:
    """Start simulated workers: ``sim_server(model="m", speedup=50.0)`` → a running ServerThread."""
    from backends.sim.server import SimSettings, create_app

    started: list[ServerThread] = []

    def start(model: str | None = None, profile: str = "h200-qwen2.5-0.5b", speedup: float = 50.0,
              **settings: Any) -> ServerThread:  # fmt: skip
        app = create_app(SimSettings(model=model, profile=profile, speedup=speedup, **settings))
        srv = ServerThread(app).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture
def gateway_server() -> Iterator[Callable[..., ServerThread]]:
    """Start gateways: ``gateway_server(config, probe=False, ...)`` → a running ServerThread, on
    the HTTP protocol ``chimera serve`` uses."""
    from router.app import create_app
    from router.wire import HeadFirstProtocol

    started: list[ServerThread] = []

    def start(config: Config, **kwargs: Any) -> ServerThread:
        kwargs.setdefault("probe", False)
        srv = ServerThread(create_app(config, **kwargs), http=HeadFirstProtocol).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture
def fake_server() -> Iterator[Callable[[Any], ServerThread]]:
    started: list[ServerThread] = []

    def start(worker: Any) -> ServerThread:
        srv = ServerThread(worker, log_level="critical").start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
