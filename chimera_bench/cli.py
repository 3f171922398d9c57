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

#: What the bench imports beyond serving: the ``bench`` extra (router.cli says the same where the bench itself
#: is not installed).
BENCH_EXTRA = "pip install 'chimera-router[bench]'"
EXTRA_MODULES = ("openai", "matplotlib", "rich")


def check_extra() -> None:
    """ChimeraError (one line) when the ``bench`` extra is not installed."""
    missing = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ChimeraError(
            f"this command needs the bench's libraries (missing: {', '.join(missing)}): {BENCH_EXTRA}"
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
    b.add_argument("--stream", choices=("on", "off", "both"), help="overhead: streamed requests, non-streamed ones "
                   "(one JSON body), or both (default: on)")  # fmt: skip
    b.add_argument(
        "--unseen", action="store_true",
        help="start the config's sims, but give the gateway none of their profiles, speedups or qualities (each "
        "backend as a url: worker it has no profile of, each agent's SLA in wall-clock time), and post every "
        "verdict as feedback: routing on workers the router has never seen",
    )  # fmt: skip
    b.add_argument(
        "--peers", type=_csv(str, "NAME:POLICY"), default=(), metavar="NAME:POLICY,...",
        help="the routers a user would run instead, each started by the bench in front of the same workers and "
        "reported as a row beside --policies: vllm-router:{round_robin,cache_aware,power_of_two,consistent_hash}, "
        "sglang-router:{round_robin,cache_aware,power_of_two}, litellm:{simple-shuffle,least-busy,"
        "latency-based-routing} (pip install 'chimera-router[peers]'; chimera_bench/peers.py says what each is "
        "given); overhead only: floor, the server and client chimera is built on with nothing of its own",
    )  # fmt: skip
    b.add_argument(
        "--gateway", metavar="URL",
        help="drive a gateway that is already running (`chimera serve --config` of the same config: its workers, "
        "its policy) instead of starting the config's sims and a gateway per policy; watch it with `chimera top`",
    )  # fmt: skip
    b.add_argument(
        "--costs", type=_csv(float, "numbers"), metavar="W1,W2,...",
        help="sweep the predictive policy's gateway.policy_options.wrong_answer_s (modelled seconds; 0: the slack "
        "rule): predictive runs once per cost, as row predictive_w<cost>, the other --policies once; also writes "
        "cost_frontier.png and prints the task success pooled over seeds (chimera_bench/sweep.py)",
    )  # fmt: skip


def add_collect_arguments(c: argparse.ArgumentParser) -> None:
    """`chimera predictor collect` (chimera_bench/collect.py)."""
    c.description = ("Run the bench's workloads through the gateway once per seed and rate, with a model-less "
                     "gateway.predictor where the config has none (so every request's features are logged and every "
                     "verdict is posted as feedback), and write the runs' request logs as one log for `chimera "
                     "predictor train --log OUT`. The bench's own files stay in OUT.runs/.")  # fmt: skip
    c.add_argument("--config", required=True, help="YAML config (its sim: workers are started per run)")
    c.add_argument("--out", required=True, help="the request log to write (JSON lines), for `predictor train --log`")
    c.add_argument("--workload", default="mixed", help="codegen | math | mixed | chat (default: mixed)")
    c.add_argument("--policies", type=_csv(str, "policy names"), default=("round_robin",),
                   help="the routing while collecting (default round_robin: every model answers)")  # fmt: skip
    c.add_argument("--rate", type=_csv(float, "numbers"), default=(1.0, 2.0, 3.0, 4.0),
                   help="workflows/s, one run each (default 1,2,3,4: give rates from light to heavy load for your "
                   "fleet, wall clock)")  # fmt: skip
    c.add_argument("--seeds", type=_csv(int, "integers"), default=(1,), help="one run per seed and rate (default 1)")
    c.add_argument("--duration", type=float, default=20.0, help="measured seconds per run, after the warm-up")
    c.add_argument("--warmup", type=float, default=3.0)
    c.add_argument("--drain", type=float, help="seconds to wait for in-flight workflows after the arrivals end")
    c.add_argument("--speedup", type=float, help="override every sim worker's speedup")


def run_collect(args: argparse.Namespace) -> int:
    check_extra()
    from pathlib import Path

    out = Path(args.out)
    if out.is_dir():
        raise ConfigError("must name a file to write the request log to", key="--out")
    args.users, args.replicas, args.clients, args.costs, args.peers, args.stream = None, 1, 1, None, (), None
    _check(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (stop what the bench started)
    from chimera_bench.collect import collect, runs_dir
    from chimera_bench.runner import BenchSpec

    spec = BenchSpec(
        config_path=args.config, workload=args.workload, policies=tuple(args.policies), rates=tuple(args.rate),
        users=None, duration_s=args.duration, warmup_s=args.warmup, seeds=tuple(args.seeds), out=str(runs_dir(out)),
        speedup=args.speedup, drain_s=args.drain, plots=False,
    )  # fmt: skip
    counts = collect(spec, out)
    print(f"{out}: {counts['requests']} requests and {counts['feedback']} verdicts from {counts['runs']} runs "
          f"({counts['errors']} errors); next: chimera predictor train --log {out} --out MODEL")  # fmt: skip
    return 0


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
    if args.workload == "overhead" and args.costs:
        raise ConfigError("the overhead workload has no policies to sweep", key="--costs")
    if args.peers and args.replicas != 1 and args.workload != "overhead":  # (overhead: chimera's row only)
        raise ConfigError("a peer runs as its users run it; --replicas is chimera's", key="--replicas")
    if args.stream is not None and args.workload != "overhead":
        raise ConfigError("only the overhead workload's requests are set here (the others stream, as agents do)",
                          key="--stream")  # fmt: skip
    if getattr(args, "gateway", None) is not None:
        for key, given in (("--peers", args.peers), ("--costs", args.costs), ("--unseen", args.unseen),
                           ("--speedup", args.speedup is not None), ("--replicas", args.replicas != 1),
                           ("--workload overhead", args.workload == "overhead")):  # fmt: skip
            if given:
                raise ConfigError("drives the gateway and workers that run there: it starts none of its own",
                                  key=f"{key} with --gateway")  # fmt: skip
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

        streams = {"on": (True,), "off": (False,), "both": (True, False)}[args.stream or "on"]
        run_overhead(rates=args.rate or (200.0,), duration_s=args.duration, warmup_s=args.warmup, out=args.out,
                     pin=not args.no_pin, seed=seeds[0], peers=tuple(args.peers), streams=streams,
                     replicas=args.replicas)  # fmt: skip
        return 0
    if not args.config:
        raise ConfigError("--config is required for this workload", key="--config")
    from chimera_bench.runner import BenchSpec, run_bench
    from router.core.config import load_config

    policies = args.policies or (load_config(args.config).gateway.policy,)
    spec = BenchSpec(
        config_path=args.config, workload=args.workload, policies=(*policies, *args.peers), rates=tuple(args.rate),
        users=args.users, duration_s=args.duration, warmup_s=args.warmup, seeds=seeds, out=args.out,
        speedup=args.speedup, drain_s=args.drain, plots=not args.no_plots, replicas=args.replicas,
        clients=args.clients, unseen=args.unseen, gateway=args.gateway,
    )  # fmt: skip
    try:
        if args.costs:
            from chimera_bench.sweep import run_sweep

            run_sweep(spec, args.costs)
        else:
            run_bench(spec)
    except KeyboardInterrupt:  # the runs finished so far are in results.json; say that this one is not all
        print(f"chimera: interrupted: {args.out}/results.json holds the runs that finished", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0
