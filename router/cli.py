"""The `chimera` command line. Exit codes: 0 ok, 2 bad input (config, arguments), 1 anything else
(a port already in use among them: ``chimera: error: cannot listen on HOST:PORT: address already in use``).

A user's mistake is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.core.config import Config, PolicyOptions, load_config
from router.core.errors import ChimeraError, ConfigError
from router.core.stateurl import redacted
from router.core.types import ENGINES
from router.policies import USES_PREDICTOR

if TYPE_CHECKING:
    from backends.sim.server import SimSettings

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
BENCH_EXTRA = "pip install 'chimera-router[bench]'"  # what `chimera bench` and `predictor collect` need


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"chimera: error: {message} (see `{self.prog} --help`)\n")


def _port(text: str) -> int:
    """argparse type of a TCP port (0: any free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {port}")
    return port


def _positive(text: str) -> float:
    """argparse type of a number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def _count(text: str) -> int:
    """argparse type of a count of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="chimera", description="Performance-aware gateway for multi-agent LLM apps.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("serve", help="run the gateway (and the simulated workers the config declares)")
    s.add_argument("--config", required=True, help="YAML config file")
    s.add_argument("--host", help="override gateway.host")
    s.add_argument("--port", type=_port, help="override gateway.port")
    s.add_argument("--workers", type=int, default=1, help="gateway processes (share state via Redis)")
    s.add_argument("--no-sims", action="store_true", help="do not start the config's sim: workers")

    c = sub.add_parser("check", help="validate a config and print the resolved fleet")
    c.add_argument("file")

    m = sub.add_parser("sim", help="run one simulated vLLM worker")
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=_port, required=True)
    m.add_argument("--model", help="served model name (default: the profile's)")
    m.add_argument("--profile", default="h200-qwen2.5-1.5b", help="profile name or JSON path")
    m.add_argument("--kv-tokens", type=int, help="KV budget in tokens (default: the profile's)")
    m.add_argument("--speedup", type=float, default=1.0, help="simulated-time speed factor")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--max-num-seqs", type=int)
    m.add_argument("--max-num-batched-tokens", type=int)
    m.add_argument("--max-model-len", type=int, help="as vLLM's: the longest prompt + output (default: the profile's)")
    m.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs",
                   help="as vLLM's: the waiting queue in arrival order, or by each request's priority")  # fmt: skip
    m.add_argument("--runner", choices=("generate", "pooling"), default="generate",
                   help="as vLLM's: a generative model (completions) or a pooling one (/v1/embeddings)")  # fmt: skip
    m.add_argument("--engine", choices=ENGINES, default="vllm",
                   help="serve this engine's metrics, health and identity endpoints (default: vLLM's)")  # fmt: skip
    m.add_argument(
        "--also", action="append", default=[],
        metavar="port=P,profile=X[,model=M,kv_tokens=K,max_model_len=L,seed=S,host=H,...]",
        help="another worker on the same GPU, served by this process on one shared GPU clock (repeatable)",
    )  # fmt: skip

    from backends.workers_cli import add_arguments as add_workers_arguments  # imports no vLLM

    add_workers_arguments(sub.add_parser("workers", help="start the config's real vLLM workers (launch:)"))

    from backends.profiling.command import add_arguments as add_profile_arguments  # argparse only: cheap

    add_profile_arguments(sub.add_parser("profile", help="probe a live worker and fit its profile (or refit probes)"))

    t = sub.add_parser("top", help="a live view of a running gateway: workers, load, predictions, agents, SLA")
    t.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway (default: the quickstart's)")
    t.add_argument("--interval", type=_positive, default=1.0, help="seconds between reads (default: 1)")
    t.add_argument("--frames", type=_count, help="print this many frames, one below the other, then exit")

    bench = sub.add_parser("bench", help="replay a multi-agent workload through the gateway per policy")

    from predictor.cli import add_arguments as add_predictor_arguments  # argparse only: cheap

    predictor_commands = add_predictor_arguments(
        sub.add_parser("predictor", help="collect traffic, train / evaluate the latency predictor on request logs")
    )
    collect = predictor_commands.add_parser(
        "collect", help="run the bench's workloads under a baseline policy and write the request log to train on"
    )
    if _has_bench():  # an image with only what serves has not: main() says what to install
        from chimera_bench.cli import add_arguments as add_bench_arguments  # argparse only: cheap
        from chimera_bench.cli import add_collect_arguments

        add_bench_arguments(bench)
        add_collect_arguments(collect)
    return p


def _has_bench() -> bool:
    return importlib.util.find_spec("chimera_bench") is not None


def _needs_bench(argv: Sequence[str]) -> bool:
    return list(argv[:1]) == ["bench"] or list(argv[:2]) == ["predictor", "collect"]


def _cmd_check(args: argparse.Namespace) -> int:
    from router.checks import exposure, guessed_profiles, inert_options
    from router.policies import check_policy

    cfg = load_config(args.file)
    check_policy(cfg)
    print(describe(cfg, args.file))
    for line in [*exposure(cfg), *inert_options(cfg), *guessed_profiles(cfg)]:
        print(f"warning: {line}", file=sys.stderr)
    return EXIT_OK


def describe(cfg: Config, file: str) -> str:
    """The resolved fleet, as ``chimera check`` prints it: what differs from the defaults, secrets hidden."""
    g = cfg.gateway
    lines = [
        f"{file}: ok",
        f"gateway  {g.host}:{g.port}  policy={g.policy}  state={redacted(g.state)}"
        + (f"  default_agent={g.default_agent}" if g.default_agent else ""),
    ]
    details = []
    if g.policy in USES_PREDICTOR or g.predictor is not None:
        model = g.predictor.model if g.predictor is not None else None
        found = "" if model is None or Path(model).exists() else " (not found here)"
        details.append(f"predictor={model + found if model else 'analytic prior'}")
    changed = {k: v for k, v in g.policy_options.model_dump().items() if v != PolicyOptions.model_fields[k].default}
    if changed:
        details.append("policy_options[" + ", ".join(f"{k}={v}" for k, v in changed.items()) + "]")
    details.append("admission=" + ("on" if g.admission is not None else "off"))
    if g.request_log:
        details.append(f"request_log={g.request_log}")
    lines += ["  " + "  ".join(details), "backends:"]
    from predictor.prior import profile_choice

    for b in cfg.backends:
        profile, why = profile_choice(b.profile_name, b.model)
        extra = [f"profile={profile}" if why == "configured" else f"profile=guess({profile})" if why == "model"
                 else f"profile=learned(from {profile})"]  # fmt: skip
        if b.sim is not None:
            sim = b.sim
            knobs = [f"seed={sim.seed}"] + [f"{k}={v}" for k in ("kv_tokens", "max_num_seqs", "max_num_batched_tokens")
                                           if (v := getattr(sim, k)) is not None]  # fmt: skip
            extra.append(f"sim={sim.profile}@{sim.speedup:g}x({','.join(knobs)})")
        if b.launch is not None:
            extra.append(f"launch={b.launch.hf_model} gpu={b.launch.gpu} kv={b.launch.kv_cache_gib:g}GiB")
        if b.tags:
            extra.append("tags=" + ",".join(b.tags))
        if b.engine is not None:
            extra.append(f"engine={b.engine}")
        if b.scheduling_policy != "fcfs":
            extra.append(f"scheduling={b.scheduling_policy}")
        if b.api_key:
            extra.append("api_key=***")
        lines.append(
            f"  {b.name:<14} {b.model:<16} {redacted(b.url):<26} kv={b.kv_budget_tokens:<9} "
            f"max_len={b.max_model_len:<6} {' '.join(extra)}".rstrip()
        )
    lines.append("agents:")
    for a in cfg.agents:
        sla = ", ".join(f"{k}={v:g}" for k, v in a.sla.model_dump().items() if v is not None) or "none"
        keys = f"{len(a.api_keys)} key(s)" if a.api_keys else "no keys"
        overload = f"  on_overload={a.on_overload}" if g.admission is not None else ""  # (inert without admission)
        lines.append(f"  {a.name:<10} models={','.join(a.models)}  sla[{sla}]  priority={a.priority}{overload}  {keys}")
    return "\n".join(lines)



def _cmd_serve(args: argparse.Namespace) -> int:
    from router.serve import serve

    cfg = load_config(args.config)
    if args.workers < 1:
        raise ConfigError("--workers must be at least 1", key="--workers")
    serve(
        cfg, config_path=args.config, host=args.host, port=args.port, workers=args.workers, start_sims=not args.no_sims
    )
    return EXIT_OK


def _cmd_sim(args: argparse.Namespace) -> int:
    from backends.sim.server import serve
    from router.core.errors import ProfileError

    try:
        settings, also = sim_workers(args)
        serve(settings, host=args.host, port=args.port, also=also)
    except ProfileError as exc:  # the flag at fault: --speedup, --kv-tokens, ...; the profile by default
        raise ConfigError(str(exc), key="--" + (exc.setting or "profile").replace("_", "-")) from exc
    return EXIT_OK


def sim_workers(args: argparse.Namespace) -> tuple[SimSettings, list[tuple[SimSettings, str, int]]]:
    """`chimera sim`'s arguments as the first worker's settings and its ``--also`` workers ``(settings, host,
    port)``, each checked: a bad one raises :class:`ProfileError` (first worker) or :class:`ConfigError`."""
    from backends.sim.server import SimSettings, check_settings

    settings = SimSettings(
        model=args.model,
        profile=args.profile,
        kv_tokens=args.kv_tokens,
        speedup=args.speedup,
        seed=args.seed,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        scheduling_policy=args.scheduling_policy,
        max_model_len=args.max_model_len,
        engine=args.engine,
        runner=args.runner,
    )
    check_settings(settings)
    also = [_sim_also(spec, settings, args.host) for spec in args.also]
    ports = [args.port, *(port for _, _, port in also)]
    if len(set(ports)) != len(ports):
        raise ConfigError(f"workers sharing a GPU need distinct ports, got {ports}", key="--also")
    return settings, also


_ALSO_INTS = ("port", "kv_tokens", "seed", "max_num_seqs", "max_num_batched_tokens", "max_model_len")
_ALSO_KEYS = ("host", "model", "profile", "scheduling_policy", "engine", "runner", *_ALSO_INTS)


def _sim_also(spec: str, first: SimSettings, host: str) -> tuple[SimSettings, str, int]:
    """``--also port=P,profile=X,...`` → (settings, host, port); the speedup is the first worker's."""
    fields: dict[str, Any] = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in _ALSO_KEYS or not value.strip():
            raise ConfigError(f"bad --also item {part!r} (keys: {', '.join(_ALSO_KEYS)})", key="--also")
        try:
            fields[key] = int(value) if key in _ALSO_INTS else value.strip()
        except ValueError as exc:
            raise ConfigError(f"--also {key} must be an integer, got {value!r}", key="--also") from exc
    if "port" not in fields:
        raise ConfigError(f"--also {spec!r} needs a port", key="--also")
    port, host = fields.pop("port"), fields.pop("host", host)
    if not 0 <= port <= 65535:
        raise ConfigError(f"port must be 0..65535, got {port}", key="--also")
    from backends.sim.server import SimSettings, check_settings
    from router.core.errors import ProfileError

    settings = SimSettings(**{"profile": first.profile, "speedup": first.speedup, **fields})
    try:
        check_settings(settings)
    except ProfileError as exc:
        raise ConfigError(f"port={port}: {exc}", key="--also") from exc
    return settings, host, port


def _cmd_bench(args: argparse.Namespace) -> int:
    from chimera_bench.cli import run

    return run(args)


def _cmd_top(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("rich") is None:
        from router.top import TOP_EXTRA

        print(f"chimera: `chimera top` needs rich: {TOP_EXTRA}", file=sys.stderr)
        return EXIT_FAIL
    from router.top import run

    return run(args.url, args.interval, args.frames)


def _cmd_workers(args: argparse.Namespace) -> int:
    from backends.workers_cli import run

    return run(args)


def _cmd_profile(args: argparse.Namespace) -> int:
    from backends.profiling.command import run

    return run(args)


def _cmd_predictor(args: argparse.Namespace) -> int:
    if args.predictor_command == "collect":
        from chimera_bench.cli import run_collect

        return run_collect(args)
    from predictor.cli import run

    return run(args)


_COMMANDS = {"serve": _cmd_serve, "check": _cmd_check, "sim": _cmd_sim, "bench": _cmd_bench, "top": _cmd_top,
             "predictor": _cmd_predictor, "workers": _cmd_workers, "profile": _cmd_profile}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if _needs_bench(argv) and not _has_bench():  # the bench package is not installed (e.g. the Docker image)
        print(f"chimera: this command needs the bench: {BENCH_EXTRA}", file=sys.stderr)
        return EXIT_FAIL
    args = _build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"chimera: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ChimeraError as exc:
        print(f"chimera: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except BrokenPipeError:  # `chimera check FILE | head`: the reader left; nothing to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no second error at exit's flush)
        return EXIT_FAIL
    except OSError as exc:  # e.g. an output path that cannot be written: name it
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"chimera: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
