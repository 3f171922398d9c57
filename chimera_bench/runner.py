"""`chimera bench`: the same seeded workload through a fresh gateway per policy, over the same fleet.

For every seed, load point (rate or users) and policy: the config's ``sim:`` workers are started
afresh (caches start cold for every policy), a gateway process with the policy overridden is
started on a free port, the workload is offered, the measured part is summarized into one
``results.json`` entry, and everything is stopped. ``results.json`` is rewritten after every run
so an interrupted bench keeps what it measured. Then the table is printed and the plots drawn.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.listen import free_port, wait_ready
from chimera_bench import client as bc
from chimera_bench import gateway_proc, peers
from chimera_bench.stats import latencies, summarize
from chimera_bench.workloads import WORKLOADS, make_workflow
from router.core.config import Config, load_config
from router.core.errors import ChimeraError, ConfigError
from router.serve import preflight, running_sims

ROLES_OF = {"codegen": ("planner", "coder", "tester"), "math": ("solver", "verifier"), "chat": ("chat",)}
ROLES_OF["mixed"] = ROLES_OF["codegen"] + ROLES_OF["math"]


@dataclass(frozen=True)
class BenchSpec:
    config_path: str
    workload: str
    policies: tuple[str, ...]
    rates: tuple[float, ...]  # workflows/s (wall clock); empty with users
    users: int | None
    duration_s: float  # measured window, after the warm-up
    warmup_s: float
    seeds: tuple[int, ...]
    out: str
    speedup: float | None = None  # overrides every sim's speedup
    drain_s: float | None = None
    plots: bool = True
    replicas: int = 1  # gateway processes sharing one port and the config's Redis state
    clients: int = 1  # load-client processes (the workflows split among them)
    unseen: bool = False  # the gateway gets no sim profile, speedup or quality (gateway_proc.unseen)
    gateway: str | None = None  # a running gateway to drive (its workers and policy) instead of starting one
    extra: dict[str, Any] = field(default_factory=dict)


def validate(spec: BenchSpec) -> Config:
    """Every user mistake as a ConfigError (exit 2) before anything starts."""
    from router.policies import available

    cfg = load_config(spec.config_path)
    # a model that does not load: one line, not a dead gateway
    preflight(cfg, spec.config_path, request_log=False, warn=False)
    if spec.workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {spec.workload!r} (one of {', '.join((*WORKLOADS, 'overhead'))})",
                          key="--workload")  # fmt: skip
    for p in spec.policies:
        if peers.is_peer(p):
            peers.check_installed(peers.parse(p)[0])  # a peer is never handed the sims' profiles either
        elif p not in available():
            raise ConfigError(f"policy {p!r} is not available (available: {', '.join(available())})", key="--policies")
    names = {a.name for a in cfg.agents}
    missing = [r for r in ROLES_OF[spec.workload] if r not in names]
    if missing:
        raise ConfigError(f"{spec.config_path}: workload {spec.workload} needs agents named {', '.join(missing)}",
                          key="agents")  # fmt: skip
    if spec.users is None and not spec.rates:
        raise ConfigError("give --rate R[,R...] or --users N", key="--rate")
    if spec.gateway is not None:
        check_running(spec, cfg)
    if spec.replicas > 1 and not cfg.gateway.state.startswith(("redis://", "rediss://")):
        raise ConfigError(f"--replicas {spec.replicas} needs gateway.state: redis://... (replicas share the fleet "
                          "state through Redis)", key="--replicas")  # fmt: skip
    return cfg


def check_running(spec: BenchSpec, cfg: Config) -> None:
    """``--gateway URL``: a chimera gateway answers there, with the one policy the runs name."""
    import httpx

    admin, url = cfg.gateway.admin_key, str(spec.gateway).rstrip("/")
    try:
        r = httpx.get(url + "/fleet", timeout=5.0,
                      headers={"authorization": f"Bearer {admin}"} if admin else None)  # fmt: skip
        policy = r.json().get("policy") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        policy = None
    if policy is None:
        raise ConfigError(f"no chimera gateway answers /fleet at {spec.gateway}", key="--gateway")
    if spec.policies != (policy,):
        raise ConfigError(f"the gateway at {spec.gateway} routes with {policy}: give --policies {policy} or none",
                          key="--policies")  # fmt: skip


def replica_state(state: str, tag: str) -> str:
    """``state`` with a key prefix of this run's own, so no run sees an earlier run's reservations."""
    return f"{state}{'&' if '?' in state else '?'}prefix=bench-{tag}-{os.getpid()}"


def fleet_speedup(cfg: Config, override: float | None) -> float:
    """The fleet's common sim speedup (1.0 for real workers); mixed speedups are a config mistake."""
    if override is not None:
        return override
    speeds = {b.sim.speedup for b in cfg.backends if b.sim is not None}
    if len(speeds) > 1:
        raise ConfigError("the sim workers run at different speedups; give --speedup", key="backends[].sim.speedup")
    return speeds.pop() if speeds else 1.0


def run_bench(spec: BenchSpec) -> list[dict[str, Any]]:
    from rich.console import Console

    cfg = validate(spec)
    speedup = fleet_speedup(cfg, spec.speedup)
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    points: list[tuple[str, float]] = [("rate", r) for r in spec.rates]
    if spec.users:
        points = [("users", float(spec.users))]
    runs = [(seed, kind, load, policy) for seed in spec.seeds for kind, load in points for policy in spec.policies]
    entries: list[dict[str, Any]] = []
    raw: dict[str, dict[str, list[float]]] = {}
    with _progress(console) as progress:
        for n, (seed, kind, load, policy) in enumerate(runs, 1):
            label = f"[{n}/{len(runs)}] {policy} {kind}={load:g} seed={seed}"
            entry, lat = run_one(spec, cfg, speedup, policy, kind, load, seed, progress, label)
            entries.append(entry)
            console.print(
                f"{label}: {entry['requests']} requests, {entry['errors']} errors, "
                f"SLA {_pct(entry['sla_attainment'])}, success {_pct(entry['task_success'])}"
            )
            key = f"{policy}|{kind}={load:g}"
            for name, values in lat.items():
                raw.setdefault(key, {}).setdefault(name, []).extend(values)
            (out / "results.json").write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
    (out / "latencies.json").write_text(json.dumps(raw) + "\n", encoding="utf-8")
    from chimera_bench import report

    report.print_table(entries, console=None if console.is_terminal else Console(width=220), speedup=speedup)
    if spec.plots:
        report.plot_all(entries, raw, out, speedup=speedup)
    return entries


def run_one(
    spec: BenchSpec, cfg: Config, speedup: float, policy: str, kind: str, load: float, seed: int,
    progress: Any, label: str,
) -> tuple[dict[str, Any], dict[str, list[float]]]:  # fmt: skip
    tag = f"{policy.replace(':', '-')}-{kind}{load:g}-s{seed}"
    # The bench starts the sims itself, so each gets a free port: a config's fixed ports may be taken
    # by anyone else on a shared machine. A running gateway (--gateway) has its workers where the config says.
    urls = {b.name: f"http://127.0.0.1:{free_port()}"
            for b in cfg.backends if b.sim is not None and spec.gateway is None}  # fmt: skip
    fleet_cfg = gateway_proc.with_overrides(cfg, speedup=spec.speedup, urls=urls)
    horizon = spec.warmup_s + spec.duration_s
    drain = spec.drain_s if spec.drain_s is not None else max(30.0, horizon)
    log = bc.RunLog()
    sims = running_sims(fleet_cfg.backends) if spec.gateway is None else contextlib.nullcontext()
    with sims, _front(spec, cfg, fleet_cfg, policy, urls, tag) as (url, routes):
        task = progress.add_task(label, total=horizon)
        counters = asyncio.run(
            _drive(
                spec, fleet_cfg, url, kind, load, seed, horizon, drain, log, policy,
                lambda n, t: progress.update(task, completed=min(horizon, t), description=f"{label} · {n} req"),
                routes,
            )
        )  # fmt: skip
        progress.remove_task(task)
    entry: dict[str, Any] = {"policy": policy, "workload": spec.workload, kind: load, "seed": seed}
    entry.update(summarize(log, cfg, warmup_s=spec.warmup_s, duration_s=spec.duration_s, sla_scale=1.0 / speedup))
    entry["worker_counters"] = counters
    entry["worker_counters_since"] = "run"  # this run's own (before 2026-11-30: since each worker started)
    hits = sum(c.get("prefix_cache_hits", 0.0) for c in counters.values())
    queries = sum(c.get("prefix_cache_queries", 0.0) for c in counters.values())
    entry["prefix_cache_hit_rate"] = round(hits / queries, 4) if queries else None
    entry["config"] = {
        "file": spec.config_path, "workload": spec.workload, "policy": policy, kind: load, "seed": seed,
        "duration_s": spec.duration_s, "warmup_s": spec.warmup_s, "drain_s": drain, "speedup": speedup,
        "sla_scale": round(1.0 / speedup, 4), "clock": "wall-clock latencies and rates (see speedup)",
        "unseen": spec.unseen, "gateway": spec.gateway, "gateway_replicas": spec.replicas,
        "client_processes": spec.clients, "client_pools": _pools(spec),
        "backends": [{"name": b.name, "model": b.model, "kv_budget_tokens": b.kv_budget_tokens,
                      "tags": list(b.tags), **({"sim": b.sim.model_dump(),
                                                "profile_sha256": _profile_digest(b.sim.profile)} if b.sim else {})}
                     for b in fleet_cfg.backends],
        **spec.extra,
    }  # fmt: skip
    return entry, latencies(log, spec.warmup_s, spec.duration_s)


@contextlib.contextmanager
def _front(
    spec: BenchSpec, cfg: Config, fleet_cfg: Config, policy: str, urls: dict[str, str], tag: str
) -> Iterator[tuple[str, dict[str, peers.Route] | None]]:
    """What the load goes through for one row: a peer router (``NAME:POLICY``, bench.peers), yielding each
    agent's route, or chimera's gateway (``--replicas`` processes on one port) with ``policy``."""
    out = Path(spec.out)
    if spec.gateway is not None:  # already running: its own workers, policy and request log
        yield spec.gateway.rstrip("/"), None
        return
    if peers.is_peer(policy):
        with peers.running(policy, fleet_cfg, out / "logs", tag) as routes:
            yield next(iter(routes.values())).url, routes
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state = replica_state(cfg.gateway.state, tag) if spec.replicas > 1 else None
    gws, gw_logs = [], []
    try:
        for r in range(spec.replicas):
            suffix = f"-r{r}" if spec.replicas > 1 else ""
            cmd = gateway_proc.command(spec.config_path, port, policy=policy, speedup=spec.speedup, urls=urls,
                                       request_log=str(out / "logs" / f"requests-{tag}{suffix}.jsonl"),
                                       state=state, reuse_port=spec.replicas > 1, unseen=spec.unseen)  # fmt: skip
            gw_logs.append(out / "logs" / f"gateway-{tag}{suffix}.log")
            gws.append(gateway_proc.start(cmd, gw_logs[-1]))
        for gw, where in zip(gws, gw_logs, strict=True):
            try:
                wait_ready(url + "/ready", proc=gw, log_file=where)
            except ChimeraError as exc:
                workers = ", ".join(f"{b.name} {b.url}" for b in fleet_cfg.backends)
                raise ChimeraError(f"the bench's gateway did not come up ({exc}); its workers: {workers}; "
                                   f"its log: {where}") from None  # fmt: skip
        if len(gws) > 1:
            admin = cfg.gateway.admin_key
            gateway_proc.wait_replicas(url, gws, {"Authorization": f"Bearer {admin}"} if admin else None)
        yield url, None
    finally:
        for gw in gws:
            gateway_proc.stop(gw)


async def _drive(
    spec: BenchSpec, cfg: Config, url: str, kind: str, load: float, seed: int, horizon: float, drain: float,
    log: bc.RunLog, policy: str, show: Any, routes: dict[str, peers.Route] | None = None,
) -> dict[str, dict[str, float]]:  # fmt: skip
    pools = _pools(spec)
    feedback = not routes and bc.posts_feedback(cfg, policy)  # a peer has no /v1/feedback
    clients = bc.AgentClients(url, cfg, pools=pools, feedback=feedback, routes=routes)
    make_workflow(spec.workload, seed, 0)  # fail fast on a bad workload before any load
    workers = {b.name: b.url for b in cfg.backends}
    before = await bc.scrape_workers(workers)  # real workers count from their start, not this run's
    pool = _client_pool(spec.clients)
    loop = asyncio.get_running_loop()
    pollers: list[asyncio.Task[None]] = []
    finished = False
    try:
        if pool is not None:  # every process up and the SDK imported before the clock starts
            await _warm_up(pool, spec.clients)
        t0 = time.monotonic()
        done = [0]

        def on_request(n: int) -> None:
            done[0] += n

        async def tick() -> None:
            while True:
                show(done[0], time.monotonic() - t0)
                await asyncio.sleep(0.5)

        pollers = [asyncio.create_task(tick())]
        if routes is None:  # chimera's /fleet (a peer has none)
            pollers.append(asyncio.create_task(bc.poll_fleet(url, log, t0)))
        if pool is not None:
            jobs = [bc.ShardJob(url, cfg, spec.workload, kind, load, seed, horizon, drain, (k, spec.clients), pools,
                                feedback, routes) for k in range(spec.clients)]  # fmt: skip
            parts = await asyncio.gather(*(loop.run_in_executor(pool, bc.run_shard, j, t0) for j in jobs))
            for part in parts:
                log.requests.extend(part.requests)
                log.workflows.extend(part.workflows)
                on_request(len(part.requests))
        elif kind == "users":
            await bc.closed_loop(clients, spec.workload, seed, int(load), horizon, drain, log, on_request, t0)
        else:
            await bc.open_loop(clients, spec.workload, seed, load, horizon, drain, log, on_request, t0)
        finished = True
        return bc.counters_since(before, await bc.scrape_workers(workers))
    finally:
        for p in pollers:
            p.cancel()
        await asyncio.gather(*pollers, return_exceptions=True)
        await clients.close()
        if pool is not None:
            _stop_pool(pool, finished)


async def _warm_up(pool: ProcessPoolExecutor, n: int) -> None:
    """Until each of the ``n`` processes has run :func:`bench.client.warm_up` (the pool may hand two
    warm-ups to one process, so again until ``n`` distinct ones answered; 10 rounds at most)."""
    loop, pids = asyncio.get_running_loop(), set[int]()
    for _ in range(10):
        pids |= set(await asyncio.gather(*(loop.run_in_executor(pool, bc.warm_up) for _ in range(n))))
        if len(pids) >= n:
            return


def _stop_pool(pool: ProcessPoolExecutor, finished: bool) -> None:
    """Shut the client processes down; when the run did not finish (interrupted, a shard failed), terminate
    them first rather than wait out their horizon and drain while they keep sending load."""
    if not finished:
        for proc in list(getattr(pool, "_processes", {}).values()):  # no public API before Python 3.14
            proc.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


POOLS_PER_REPLICA = 8


def _pools(spec: BenchSpec) -> int:
    """Connection pools per load client: with replicas on one port, several per replica, so that the
    kernel (which hands out connections, not requests) reaches every replica even at a light load."""
    return POOLS_PER_REPLICA * spec.replicas if spec.replicas > 1 else 1


def _client_pool(n: int) -> ProcessPoolExecutor | None:
    """``n`` > 1 load-client processes (spawned: the bench's event loop and threads are not forked)."""
    return ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) if n > 1 else None


def _profile_digest(name: str) -> str | None:
    """Which version of a sim profile a run used (profiles get recalibrated between runs): a digest of what the
    simulator reads, so that a profile whose ``provenance`` or ``raw`` points alone change keeps its digest."""
    from router.core.profile import PROFILE_DIR

    path = Path(name) if name.endswith(".json") else PROFILE_DIR / f"{name}.json"
    try:
        terms = {k: v for k, v in json.loads(path.read_bytes()).items() if k not in ("provenance", "raw")}
    except (OSError, ValueError, AttributeError):
        return None
    return hashlib.sha256(json.dumps(terms, sort_keys=True).encode()).hexdigest()[:12]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _progress(console: Any) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                    transient=True, disable=not console.is_terminal)  # fmt: skip

