"""`chimera bench` arguments (argparse only, cheap to import) and the dispatch to the runners."""

from __future__ import annotations

import argparse
import importlib.util
import math
import signal
import sys
from collections.abc import Callable
from typing import TypeVar

from router.core.errors import ChimeraError, ConfigError

EXIT_INTERRUPTED = 130  # as a shell reports a command stopped by Ctrl-C: not a complete run

T = TypeVar("T")

#: What the bench imports beyond serving: the ``bench`` extra.
EXTRA_MODULES = ("openai", "matplotlib", "rich")


def check_extra() -> None:
    """ChimeraError (one line) when the ``bench`` extra is not installed."""
    missing = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ChimeraError(
            f"chimera bench needs the bench extra (missing: {', '.join(missing)}): pip install 'chimera-router[bench]'"
        )


def _csv(kind: Callable[[str], T], what: str) -> Callable[[str], tuple[T, ...]]:
    def parse(text: str) -> tuple[T, ...]:
        try:
            items = tuple(kind(part.strip()) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}, got {text!r}") from None
        if not items:
            raise argparse.ArgumentTypeError(f"expected at least one {what}")
        return items

    return parse


def add_arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument("--config", help="YAML config (its sim: workers are started per run); not for overhead")
    b.add_argument("--workload", required=True, help="codegen | math | mixed | chat | overhead")
    b.add_argument("--policies", type=_csv(str, "policy names"), help="default: the config's policy")
    b.add_argument(
        "--rate", type=_csv(float, "numbers"), default=(), help="workflows/s (requests/s for overhead); a list sweeps"
    )
    b.add_argument("--users", type=int, help="closed loop: N users instead of Poisson arrivals")
    b.add_argument("--duration", type=float, default=60.0, help="measured seconds per run, after the warm-up")
    b.add_argument("--warmup", type=float, default=10.0, help="seconds of load before measuring")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--seeds", type=_csv(int, "integers"), help="repeat every run per seed (overrides --seed)")
    b.add_argument("--out", default="bench-out", help="directory for results.json, plots and logs")
    b.add_argument("--speedup", type=float, help="override every sim worker's speedup")
    b.add_argument("--drain", type=float, help="seconds to wait for in-flight workflows after the arrivals end")
    b.add_argument("--no-plots", action="store_true")
    b.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="gateway processes per run, sharing one port and the config's redis:// state",
    )
    b.add_argument(
        "--clients",
        type=int,
        default=1,
        help="load-client processes per run, the workflows split among them (use several above ~10 streamed "
        "requests/s: one process's SDK adds queueing of its own)",
    )
    b.add_argument("--no-pin", action="store_true", help="overhead: do not pin processes to cores")


MAX_ARRIVALS = 10_000_000  # workflows (or requests) one run may schedule


def _check(args: argparse.Namespace) -> None:
    positive = {
        "--duration": args.duration,
        "--speedup": args.speedup,
        "--users": args.users,
        "--replicas": args.replicas,
        "--clients": args.clients,
    }
    for key, value in positive.items():
        if value is not None and not (value > 0 and math.isfinite(value)):  # (nan fails `<= 0` too)
            raise ConfigError(f"must be a positive number, got {value:g}", key=key)
    for key, value in (("--warmup", args.warmup), ("--drain", args.drain)):
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"must be a number not below 0, got {value:g}", key=key)
    if not all(r > 0 and math.isfinite(r) for r in args.rate):
        raise ConfigError("every rate must be a positive number", key="--rate")
    # the arrivals are drawn up front: a rate and duration beyond any fleet would only fill the memory
    arrivals = max(args.rate, default=0.0) * (args.duration + args.warmup)
    if arrivals > MAX_ARRIVALS:
        raise ConfigError(f"--rate x (--duration + --warmup) is {arrivals:.3g} arrivals; at most {MAX_ARRIVALS:,} "
                          "per run", key="--rate")  # fmt: skip
    if args.users is not None and args.rate:
        raise ConfigError("give --rate or --users, not both", key="--users")
    if args.workload == "overhead" and args.clients != 1:
        raise ConfigError("the overhead workload has a client of its own (one process)", key="--clients")


def run(args: argparse.Namespace) -> int:
    check_extra()
    _check(args)
    # SIGTERM as SystemExit, so the `finally` blocks stop the sims and gateways this bench started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seeds = tuple(args.seeds) if args.seeds else (args.seed,)
    if args.workload == "overhead":
        from chimera_bench.overhead import run_overhead

        run_overhead(rates=args.rate or (200.0,), duration_s=args.duration, warmup_s=args.warmup, out=args.out,
                     pin=not args.no_pin, seed=seeds[0])  # fmt: skip
        return 0
    if not args.config:
        raise ConfigError("--config is required for this workload", key="--config")
    from chimera_bench.runner import BenchSpec, run_bench
    from router.core.config import load_config

    policies = args.policies or (load_config(args.config).gateway.policy,)
    spec = BenchSpec(
        config_path=args.config, workload=args.workload, policies=tuple(policies), rates=tuple(args.rate),
        users=args.users, duration_s=args.duration, warmup_s=args.warmup, seeds=seeds, out=args.out,
        speedup=args.speedup, drain_s=args.drain, plots=not args.no_plots, replicas=args.replicas,
        clients=args.clients,
    )  # fmt: skip
    try:
        run_bench(spec)
    except KeyboardInterrupt:  # the runs finished so far are in results.json; say that this one is not all
        print(f"chimera: interrupted: {args.out}/results.json holds the runs that finished", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0
