"""`chimera workers up`: argument wiring and the foreground loop around :mod:`backends.launcher`."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # the parser is built on every `chimera` call: keep httpx and the launcher out of it
    from backends.launcher import Machine, Spawn, Worker


def add_arguments(w: argparse.ArgumentParser) -> None:
    sub = w.add_subparsers(dest="workers_command", required=True, parser_class=type(w))
    up = sub.add_parser("up", help="start the config's launch: workers, wait until healthy, stop them on Ctrl-C")
    up.add_argument("--config", required=True, help="YAML config")
    up.add_argument("--dry-run", action="store_true", help="print each worker's command and environment, start nothing")
    up.add_argument("--log-dir", default="logs/workers", help="one <backend>.log per worker (default: %(default)s)")
    up.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for every worker's /health")
    up.add_argument("--python", default=sys.executable, help="the interpreter that has vLLM (default: this one)")


class _Stop(Exception):
    """SIGTERM/SIGINT while the workers run: stop them all and exit 0."""


def run(args: argparse.Namespace, *, machine: Machine | None = None, spawn: Spawn | None = None,
        out: TextIO | None = None, poll_s: float = 0.5) -> int:  # fmt: skip
    from backends.launcher import Machine, check_alive, plan_workers, preflight, running_workers, spawn_process
    from router.core.config import load_config
    from router.core.errors import ConfigError

    out = out or sys.stdout
    if args.timeout <= 0:
        raise ConfigError(f"must be positive, got {args.timeout:g}", key="--timeout")
    cfg = load_config(args.config)
    plans = plan_workers(cfg, python=args.python, log_dir=args.log_dir)
    if args.dry_run:
        if not plans:
            raise ConfigError("no backend declares launch: — nothing to start", key="backends[].launch")
        for p in plans:
            print(f"# {p.name}: {p.backend.model} on GPU {p.env['CUDA_VISIBLE_DEVICES']} at {p.backend.url} "
                  f"(log {p.log_path})", file=out)  # fmt: skip
            print(p.shell(), file=out)
        return 0
    preflight(plans, machine or Machine(python=args.python))
    previous = _install_signals(_raise_stop)
    try:
        t0 = time.monotonic()

        def up(w: Worker) -> None:
            print(f"up: {w.plan.name} ({w.plan.backend.model}) at {w.plan.backend.url} after "
                  f"{time.monotonic() - t0:.0f} s", file=out, flush=True)  # fmt: skip

        for p in plans:
            print(f"starting {p.name}: {p.shell()}", file=out, flush=True)
        spawn = spawn or spawn_process
        with running_workers(plans, spawn=spawn, timeout_s=args.timeout, poll_s=poll_s, on_up=up) as workers:
            mismatches = _check_kv(workers, out)
            print(f"all {len(workers)} workers healthy ({mismatches} KV mismatch(es)); Ctrl-C stops them",
                  file=out, flush=True)  # fmt: skip
            while True:
                for w in workers:
                    check_alive(w)
                time.sleep(poll_s)
    except _Stop:
        print("stopping workers", file=out, flush=True)
        return 0
    finally:
        _restore_signals(previous)


def _check_kv(workers: list[Worker], out: TextIO) -> int:
    import httpx

    from backends.launcher import kv_capacity

    mismatches = 0
    with httpx.Client(timeout=5.0) as http:
        for w in workers:
            check = kv_capacity(w, http)
            if check.matches:
                print(check.message(), file=out, flush=True)
            else:
                mismatches += 1
                print(f"chimera: warning: {check.message()}", file=sys.stderr, flush=True)
    return mismatches


Handler = Callable[[int, FrameType | None], object] | int | None
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def _install_signals(handler: Callable[[int, FrameType | None], None]) -> dict[signal.Signals, Handler]:
    previous: dict[signal.Signals, Handler] = {s: signal.getsignal(s) for s in _SIGNALS}
    for s in _SIGNALS:
        signal.signal(s, handler)
    return previous


def _restore_signals(previous: dict[signal.Signals, Handler]) -> None:
    for s, h in previous.items():
        signal.signal(s, signal.SIG_DFL if h is None else h)
