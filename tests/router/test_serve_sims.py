"""`chimera serve`'s simulated workers kept running: a worker that exits is reaped, logged once and started
again on its port after a backoff; stopping starts nothing more. Real `chimera sim` processes."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from backends.listen import free_port
from backends.sim.api import PID_HEADER
from router.core.config import BackendConfig, SimSpec
from router.serve import Backoff, running_sims


def sim_backend(name: str = "s1") -> BackendConfig:
    return BackendConfig(name=name, url=f"http://127.0.0.1:{free_port()}", model="qwen2.5-0.5b",
                         kv_budget_tokens=200_000, sim=SimSpec(profile="h200-qwen2.5-0.5b", speedup=5))  # fmt: skip


def health_pid(b: BackendConfig) -> int | None:
    """The pid that answers ``b``'s /health now (None: nothing answers)."""
    try:
        r = httpx.get(b.url + "/health", timeout=0.5)
    except httpx.HTTPError:
        return None
    return int(r.headers[PID_HEADER]) if r.status_code == 200 else None


def wait_for(check: Callable[[], bool], within: float) -> float:
    """Seconds until ``check()`` holds; fails the test after ``within``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < within, "condition not met in time"
        time.sleep(0.02)
    return time.monotonic() - start


def gone(pid: int) -> bool:
    """Neither running nor a zombie: reaped."""
    return not Path(f"/proc/{pid}").exists()


def exits(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "exited (" in r.getMessage()]


def test_backoff_doubles_up_to_its_cap_and_starts_over_after_a_stable_run() -> None:
    b = Backoff(first_s=0.5, max_s=30.0, stable_s=30.0)
    delays: list[float] = []
    previous = None
    for _ in range(9):
        previous = b.delay(previous, up_s=1.0)
        delays.append(previous)
    assert delays == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert b.delay(30.0, up_s=29.9) == 30.0 and b.delay(30.0, up_s=30.0) == 0.5


def test_a_killed_worker_is_reaped_logged_and_restarted_on_its_port(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chimera.serve")
    b = sim_backend()
    with running_sims([b], backoff=Backoff(first_s=0.3, max_s=0.6, stable_s=60.0)) as sims:
        pids = [health_pid(b)]
        for _ in range(3):
            old = pids[-1]
            assert old is not None and [p.pid for p in sims.processes()] == [old]
            os.kill(old, signal.SIGKILL)
            killed = time.monotonic()
            wait_for(lambda: health_pid(b) not in (None, pids[-1]), within=10)
            pids.append(health_pid(b))
            assert gone(old)  # reaped, not left a zombie
        assert time.monotonic() - killed >= 0.6  # not before its backoff
        last = pids[-1]
    assert exits(caplog) == [f"simulated worker s1 exited (status -9, SIGKILL); restarting in {d:g} s"
                             for d in (0.3, 0.6, 0.6)]  # fmt: skip
    assert len(set(pids)) == 4
    assert last is not None and gone(last) and health_pid(b) is None  # stopped, and reaped


def test_a_failing_restart_says_why_backs_off_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    """While someone else holds the port the worker cannot start: each try is logged with the worker's own
    reason and waits longer; once the port is free it comes back."""
    caplog.set_level(logging.INFO, logger="chimera.serve")
    b = sim_backend()
    with running_sims([b], backoff=Backoff(first_s=0.4, max_s=5.0, stable_s=60.0)):
        pid = health_pid(b)
        assert pid is not None
        squatter = socket.socket()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: _bound(squatter, b), within=0.3)  # the port is free as the worker dies: take it first
            squatter.listen()
            wait_for(lambda: len(exits(caplog)) >= 3, within=10)
        finally:
            squatter.close()
        wait_for(lambda: health_pid(b) not in (None, pid), within=10)
    first, *failed = exits(caplog)[:3]
    assert first.endswith("(status -9, SIGKILL); restarting in 0.4 s")
    assert failed == [f"simulated worker s1 exited (status 1: chimera: error: cannot listen on 127.0.0.1:{b.port}: "
                      f"address already in use); restarting in {d:g} s" for d in (0.8, 1.6)]  # fmt: skip


def _bound(sock: socket.socket, b: BackendConfig) -> bool:
    try:
        sock.bind((b.host, b.port))
    except OSError:
        return False
    return True


def test_stopping_while_a_worker_waits_to_restart_starts_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chimera.serve")
    a, b = sim_backend("a"), sim_backend("b")
    with running_sims([a, b], backoff=Backoff(first_s=1.0)) as sims:
        pid_a, pid_b = health_pid(a), health_pid(b)
        assert pid_a is not None and pid_b is not None
        assert sorted(p.pid for p in sims.processes()) == sorted([pid_a, pid_b])
        os.kill(pid_a, signal.SIGKILL)
        wait_for(lambda: len(exits(caplog)) == 1, within=5)
        assert [p.pid for p in sims.processes()] == [pid_b]
    stopped = time.monotonic()
    assert gone(pid_a) and gone(pid_b)
    time.sleep(max(0.0, stopped + 1.5 - time.monotonic()))  # past the restart it was waiting for
    assert health_pid(a) is None and health_pid(b) is None
    assert not [r for r in caplog.records if "restarted" in r.getMessage()]
