"""The routers a user would run instead of chimera, started by the bench in front of the same workers.

``chimera bench --peers NAME:POLICY[,...]`` runs each peer as its own users run it, from its own package (the
``peers`` extra: ``pip install 'chimera-router[peers]'``), and drives the same seeded workload through it:

* **vLLM Router** (``vllm-router``, Rust) and **SGLang's router** (``sglang-router``, Rust) balance the workers of
  one model: they send every request to one of their ``--worker-urls`` whatever model it names (a request for a
  model the chosen worker does not serve gets that worker's 404), unless they run in their multi-model gateway
  mode, which registers workers through an API of its own. So, as their users deploy them in front of several
  models, the bench starts one router per model, over that model's workers, and each agent's requests name the
  agent's first model (what an app hard-codes) and go to that model's router.
* **The LiteLLM proxy** (``litellm``, Python) routes by model group: the bench gives it one group per agent, named
  after the agent, whose deployments are every worker of every model the agent may use, with the strategy as
  ``router_settings.routing_strategy``; each agent's requests name its group.

What each is given beyond that (written to the run's ``logs/`` too, for a rerun by hand): its policy with its
own defaults for every tunable, ``--log-level error`` (no line per request), the metrics port on a free port,
and for the Rust routers the worker start-up check every second instead of 30 s (and, for a model with a single
worker, ``round_robin`` in place of ``power_of_two``, which they refuse over fewer than two: the bench says so
and the run's ``logs/peer-<tag>.json`` records it under ``fallbacks``); LiteLLM a master key (it
refuses to start without one), the local cost map (no download at start-up), no retries and no cool-downs (a
worker is never taken out of the group; chimera's bench has no failures to retry) and one process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from backends.listen import free_port, wait_ready
from chimera_bench import gateway_proc
from router.core.config import Config
from router.core.errors import ChimeraError, ConfigError

PEERS_EXTRA = "pip install 'chimera-router[peers]'"
LITELLM_KEY = "sk-chimera-bench"  # the proxy's master key: LiteLLM refuses to start without one
READY_S = 120.0  # LiteLLM imports for about 10 s on a busy 2-core machine
PORT_ATTEMPTS = 3


@dataclass(frozen=True)
class PeerKind:
    """One router package: the policies the bench offers, the module that says it is installed."""

    name: str
    module: str
    policies: tuple[str, ...]
    per_model: bool  # balances one model's workers (one router per model), else routes by model group


PEERS: dict[str, PeerKind] = {
    "vllm-router": PeerKind("vllm-router", "vllm_router",
                            ("round_robin", "cache_aware", "power_of_two", "consistent_hash", "random"), True),
    "sglang-router": PeerKind("sglang-router", "sglang_router",
                              ("round_robin", "cache_aware", "power_of_two", "random"), True),
    "litellm": PeerKind("litellm", "litellm",
                        ("simple-shuffle", "least-busy", "latency-based-routing"), False),
}  # fmt: skip


def is_peer(policy: str) -> bool:
    """Whether a bench row's ``policy`` names a peer (``NAME:POLICY``) rather than one of chimera's policies."""
    return ":" in policy


def parse(spec: str) -> tuple[PeerKind, str]:
    """``NAME:POLICY`` as a peer and its policy; a ConfigError (one line, ``--peers``) for anything else."""
    name, _, policy = spec.partition(":")
    kind = PEERS.get(name)
    if kind is None:
        raise ConfigError(f"unknown peer {name!r} in {spec!r} (one of {', '.join(PEERS)})", key="--peers")
    if policy not in kind.policies:
        raise ConfigError(f"{name} has no policy {policy!r} here (one of {', '.join(kind.policies)})", key="--peers")
    return kind, policy


def check_installed(kind: PeerKind) -> None:
    """One line naming the extra where the peer's package is missing."""
    if importlib.util.find_spec(kind.module) is None:
        raise ChimeraError(f"the peer {kind.name} is not installed: {PEERS_EXTRA}")


@dataclass(frozen=True)
class Route:
    """Where one agent's requests go through a peer, and the ``model`` they name."""

    url: str
    model: str
    api_key: str = ""  # a bearer token the router wants (LiteLLM's master key)
    pids: tuple[int, ...] = ()  # the router's processes while it runs (a Route goes to client processes)


def routes(kind: PeerKind, cfg: Config, fronts: dict[str, str]) -> dict[str, Route]:
    """Each agent's route, ``fronts`` being the peer's base URL per model (one router per model) or ``{"": url}``."""
    out: dict[str, Route] = {}
    for agent in cfg.agents:
        if kind.per_model:
            model = first_model(cfg, agent.models)
            out[agent.name] = Route(fronts[model], model)
        else:
            out[agent.name] = Route(fronts[""], agent.name, api_key=LITELLM_KEY)
    return out


def first_model(cfg: Config, models: tuple[str, ...]) -> str:
    """The first of an agent's models that some backend serves (the one an app would hard-code)."""
    served = {b.model for b in cfg.backends}
    for m in models:
        if m in served:
            return m
    raise ConfigError(f"no backend serves any of {', '.join(models)}", key="agents[].models")


MIN_WORKERS = {"power_of_two": 2}  # the Rust routers refuse to start this policy over fewer workers
FALLBACK = "round_robin"  # what a router over too few workers runs instead (over one worker, any policy is the same)


def model_policy(kind: PeerKind, policy: str, workers: int) -> str:
    """The policy a per-model router runs over ``workers`` workers: ``policy``, or ``FALLBACK`` where the router
    refuses ``policy`` over so few ("Power-of-two policy requires at least 2 workers")."""
    return FALLBACK if kind.per_model and workers < MIN_WORKERS.get(policy, 1) else policy


def rust_command(kind: PeerKind, policy: str, port: int, workers: list[str]) -> list[str]:
    """vLLM Router's or SGLang's router over ``workers`` (same flags: SGLang's router is its ancestor)."""
    cmd = [sys.executable, "-m", f"{kind.module}.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--worker-urls", *workers, "--policy", policy, "--log-level", "error",
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]  # fmt: skip
    if kind.name == "vllm-router":
        cmd += ["--worker-startup-check-interval", "1"]
    return cmd


def litellm_config(cfg: Config, strategy: str) -> dict[str, object]:
    """One model group per agent (named after it) over every worker of every model the agent may use."""
    model_list = [
        {"model_name": agent.name,
         "litellm_params": {"model": f"openai/{b.model}", "api_base": b.url.rstrip("/") + "/v1", "api_key": "EMPTY"}}
        for agent in cfg.agents for b in cfg.backends if b.model in agent.models
    ]  # fmt: skip
    return {
        "model_list": model_list,
        "router_settings": {"routing_strategy": strategy, "num_retries": 0, "disable_cooldowns": True},
        "litellm_settings": {"request_timeout": 600},
        "general_settings": {"master_key": LITELLM_KEY, "disable_spend_logs": True},
    }


def litellm_command(config_path: Path, port: int) -> list[str]:
    exe = Path(sys.executable).with_name("litellm")
    found = str(exe) if exe.exists() else shutil.which("litellm")
    if found is None:
        raise ChimeraError(f"the litellm proxy's command is not installed: {PEERS_EXTRA}")
    return [found, "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]


LITELLM_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "DISABLE_ADMIN_UI": "True"}


@contextlib.contextmanager
def running(spec: str, cfg: Config, logs: Path, tag: str, cpu: int | None = None) -> Iterator[dict[str, Route]]:
    """The peer ``spec`` (``NAME:POLICY``) in front of ``cfg``'s backends (already running) until the block
    ends, on core ``cpu`` if given; yields each agent's route. Its command lines go to ``logs/peer-<tag>.json``."""
    kind, policy = parse(spec)
    check_installed(kind)
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[tuple[subprocess.Popen[bytes], str, Path]] = []
    fronts: dict[str, str] = {}
    commands: list[list[str]] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ready = "/health/liveliness" if kind.name == "litellm" else "/readiness"
    try:
        fallbacks: dict[str, str] = {}
        makers: list[tuple[str, Callable[[int], list[str]]]] = []  # (the model it fronts, "": all), its command
        if kind.per_model:
            for model in dict.fromkeys(first_model(cfg, a.models) for a in cfg.agents):
                workers = [b.url.rstrip("/") for b in cfg.backends if b.model == model]
                used = model_policy(kind, policy, len(workers))
                if used != policy:
                    fallbacks[model] = used
                    print(f"{kind.name} {policy} needs {MIN_WORKERS[policy]} workers and {model} has {len(workers)}: "
                          f"its router runs {used} (every request to its one worker, whatever the policy)",
                          file=sys.stderr)  # fmt: skip
                makers.append((model, functools.partial(rust_command, kind, used, workers=workers)))
        else:
            conf = logs / f"litellm-{tag}.json"  # YAML is a superset of JSON: the proxy reads it as its config
            conf.write_text(json.dumps(litellm_config(cfg, policy), indent=1) + "\n", encoding="utf-8")
            makers.append(("", functools.partial(litellm_command, conf)))
            env.update(LITELLM_ENV)
        for model, make in makers:
            log = logs / f"peer-{tag}-{len(procs)}.log"
            proc, url, cmd = _start(make, ready, log, cpu, env)
            procs.append((proc, url, log))
            commands.append(cmd)
            fronts[model] = url
        said = {"peer": spec, "commands": commands, **({"fallbacks": fallbacks} if fallbacks else {})}
        (logs / f"peer-{tag}.json").write_text(json.dumps(said, indent=1) + "\n")
        if kind.per_model:  # ready with one worker registered: wait for all of them
            for (proc, url, log), model in zip(procs, fronts, strict=True):
                _wait_workers(kind, url, sum(b.model == model for b in cfg.backends), proc, log)
        by_url = {url: proc.pid for proc, url, _ in procs}
        yield {agent: dataclasses.replace(r, pids=(by_url[r.url],)) for agent, r in routes(kind, cfg, fronts).items()}
    finally:
        for proc, _, _ in procs:
            gateway_proc.stop(proc)


def _start(make: Callable[[int], list[str]], ready: str, log: Path, cpu: int | None,
           env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str, list[str]]:  # fmt: skip
    """A peer's process on a free port, once it answers ``ready``; on another port where the one it was given was
    taken before it could listen (a free port is only free until someone binds it)."""
    for attempt in range(PORT_ATTEMPTS):
        port = free_port()
        cmd = make(port)
        proc = gateway_proc.start(cmd, log, cpu, env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url + ready, READY_S, proc=proc, log_file=log)
            return proc, url, cmd
        except ChimeraError:
            gateway_proc.stop(proc)
            taken = "address already in use" in log.read_text(encoding="utf-8", errors="replace").lower()
            if not taken or attempt == PORT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _wait_workers(kind: PeerKind, url: str, n: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the router lists ``n`` healthy workers (its readiness passes with the first one)."""
    path = "/list_workers" if kind.name == "vllm-router" else "/workers"
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ChimeraError(f"{kind.name} exited with status {proc.returncode}; its log: {log}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            body = httpx.get(url + path, timeout=2.0).json()
            listed = body.get("urls") if "urls" in body else [w for w in body.get("workers", []) if w.get("is_healthy")]
            if len(listed or []) >= n:
                return
        time.sleep(0.2)
    raise ChimeraError(f"{kind.name} at {url} did not list its {n} workers within {READY_S:g} s; its log: {log}")
