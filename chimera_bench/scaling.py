"""Gateway replicas on one Redis, measured on many cores: how far chimera scales out.

    python -m chimera_bench.scaling --replicas 1,2,4,8 --serve-workers 8 --rates 1000,4000 --out DIR

Zero-latency workers (:mod:`chimera_bench.fastworker`, one core each) behind N gateway processes on one Redis
(``redis://…?prefix=scale``; least outstanding, which reads every replica's load), each replica on a core and a port of
its own, the load client's connections opened to each in turn (as a load balancer would); or ``chimera serve --workers
N`` (``--serve-workers``), N processes on one port, on N cores. The load comes from ``--clients`` processes, a core
each: the same bare HTTP/1.1 client as the overhead workload (:func:`chimera_bench.overhead.offer`).

Per setting:

* **Saturation**: the clients hold ``--connections`` requests in flight per gateway process for ``--duration``
  seconds (a closed loop; far more in flight and a saturated process answers Redis later than ``op_timeout_s``):
  the requests/s completed is what the replicas carry at most (``--repeat`` runs: their median and range).
* **Latency at fixed rates**: an open-loop Poisson stream at each of ``--rates`` (split over the clients), through the
  gateways and straight to the workers: added p50 and p99 (scheduled arrival to end of body). A rate above 90 % of
  the setting's saturation is skipped.
* **Redis**: the gateways' own round-trip counter (``chimera_state_redis_commands_total``) and Redis's processed
  commands, both per request, and the CPU Redis spent (``INFO cpu``), as a share of one core; and its ceiling: the
  state's PUT script (two per request) called by every client core as fast as Redis answers, with as many replicas'
  load hashes as each setting has.

Where ``redis-server`` is not on the PATH, ``--redis-server PATH`` names one. ``DIR/scaling.json`` holds the raw
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import redis

from backends.listen import free_port, wait_ready
from chimera_bench import gateway_proc
from chimera_bench.overhead import _Conn, body, offer, request_head
from chimera_bench.stats import quantiles
from router.app import STATE_COUNTERS_S
from router.core.errors import ChimeraError

CONFIG_HEAD = """gateway: {{host: 127.0.0.1, port: {gw_port}, state: "{state}", policy: least_outstanding,
           default_agent: chat}}
backends:
"""
BACKEND = '  - {{name: fast-{i}, url: "http://127.0.0.1:{port}", model: fast, kv_budget_tokens: 1000000}}\n'
AGENTS = "agents:\n  - {name: chat, models: [fast]}\n"
BUSY_SHARE = 0.9  # a fixed rate above this share of a setting's saturation is not measured there
CLIENT_BOUND_SHARE = 0.9  # a Redis ceiling run that kept Redis's core busy less than this was bound by its clients


def _pin(cpus: set[int]) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


# -- the load, one process per client core -----------------------------------------------------------------------


async def _closed(urls: Sequence[str], connections: int, warmup_s: float, duration_s: float, payload: bytes,
                  offset: int) -> dict[str, Any]:  # fmt: skip
    """``connections`` requests in flight for ``warmup_s + duration_s``: the requests/s completed in the measured
    part, and their latencies."""
    addrs = [(h, int(p)) for h, p in (u.removeprefix("http://").split(":") for u in urls)]
    head = request_head(addrs[0][0], payload)
    t0 = time.monotonic()
    start, end = t0 + warmup_s, t0 + warmup_s + duration_s
    done, total, errors, lat = [0], [0], [0], []

    async def lane(i: int) -> None:
        conn: _Conn | None = None
        while (now := time.monotonic()) < end:
            try:
                if conn is None:
                    conn = _Conn(*await asyncio.open_connection(*addrs[(offset + i) % len(addrs)]))
                await asyncio.wait_for(conn.request(head), timeout=10.0)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
                errors[0] += now >= start
                if conn is not None:
                    conn.writer.close()
                conn = None
                await asyncio.sleep(0.01)
                continue
            finished = time.monotonic()
            total[0] += 1
            if start <= finished < end:
                done[0] += 1
                lat.append((finished - now) * 1000)
        if conn is not None:
            conn.writer.close()

    await asyncio.gather(*(lane(i) for i in range(connections)))
    return {"completed": done[0], "all_completed": total[0], "errors": errors[0], "rps": done[0] / duration_s,
            "latencies_ms": lat}  # fmt: skip


def _client(job: dict[str, Any]) -> dict[str, Any]:
    """One client process: pinned to its core, runs a closed or an open loop, returns its figures."""
    _pin({job["cpu"]})
    payload = body(job["stream"])
    if job["kind"] == "closed":
        return asyncio.run(_closed(job["urls"], job["connections"], job["warmup_s"], job["duration_s"], payload,
                                   job["offset"]))  # fmt: skip
    k = job["offset"] % len(job["urls"])
    urls = job["urls"][k:] + job["urls"][:k]
    return asyncio.run(offer(urls[0], job["rate"], job["duration_s"], job["warmup_s"], job["seed"], payload,
                             spread=tuple(urls[1:]), raw=True))  # fmt: skip


def _drive(pool: Any, cpus: list[int], **job: Any) -> list[dict[str, Any]]:
    jobs = [{**job, "cpu": cpu, "offset": k, "seed": f"{job.get('seed', 0)}-{k}",
             "rate": job.get("rate", 0.0) / len(cpus)} for k, cpu in enumerate(cpus)]  # fmt: skip
    return list(pool.map(_client, jobs))


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 2)


def _merged(parts: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    return quantiles([x for p in parts for x in p[key]])


# -- Redis and the gateways' counters ----------------------------------------------------------------------------


def _redis_now(client: redis.Redis) -> tuple[float, float]:
    info = client.info()
    return float(info["total_commands_processed"]), float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _counter(ports: Sequence[int], name: str) -> float:
    total = 0.0
    for port in ports:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        total += sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))
    return total


def _round_trips(ports: Sequence[int]) -> float:
    """The gateways' Redis round trips so far (``--workers N``: every process's, summed by any one's /metrics, once
    each has published its own)."""
    time.sleep(STATE_COUNTERS_S + 0.2)
    return _counter(ports, "chimera_state_redis_commands_total")


def _put_loop(job: dict[str, Any]) -> dict[str, Any]:
    """One process calling the state's PUT script as fast as Redis answers (pipelines of ``batch``), as replica
    ``me`` of ``replicas`` on ``workers`` workers: the scripts/s it got."""
    from router.state import redis_lua

    _pin({job["cpu"]})
    client = redis.Redis(port=job["port"])
    put = client.register_script(redis_lua.PUT)
    keys = [f"{{ceiling}}:load:r{job['me']}", "{ceiling}:replicas"]
    done, i, end = 0, 0, time.monotonic() + job["seconds"]
    while time.monotonic() < end:
        pipe = client.pipeline(transaction=False)
        for _ in range(job["batch"]):
            i += 1
            # a version newer than any stored (the clock is the machine's, shared by the processes writing as one
            # replica), so every PUT writes as a real one does
            put([*keys], [f"r{job['me']}", 10_000, "{ceiling}:load:", f"w{i % job['workers']}", time.monotonic_ns(),
                          1, 500, 0], client=pipe)  # fmt: skip
        pipe.execute()
        done += job["batch"]
    return {"scripts": done, "seconds": job["seconds"]}


def redis_ceiling(pool: Any, cpus: list[int], port: int, replicas: int, workers: int, seconds: float = 3.0,
                  batch: int = 50) -> dict[str, Any]:  # fmt: skip
    """How many of the state's PUT scripts one Redis runs per second with ``replicas`` replicas' load hashes to
    read (each PUT reads every other replica's numbers for its worker), and so how many requests/s (two PUTs each)
    one Redis carries at most: ``client_bound`` where the clients, not Redis, set the pace (then
    ``requests_per_s_at_one_core`` extrapolates). Pipelined, so each call costs Redis less I/O than a gateway's."""
    rdb = redis.Redis(port=port)
    for r in range(replicas):  # every replica's load hash present, as in a fleet of that many
        rdb.hset(f"{{ceiling}}:load:r{r}", mapping={f"w{w}:{k}": 1 for w in range(workers) for k in "vrtp"})
        rdb.sadd("{ceiling}:replicas", f"r{r}")
    cpu0 = _redis_now(rdb)[1]
    t0 = time.monotonic()
    jobs = [{"cpu": cpu, "port": port, "me": k % replicas, "workers": workers, "seconds": seconds, "batch": batch}
            for k, cpu in enumerate(cpus)]  # fmt: skip
    got = list(pool.map(_put_loop, jobs))
    wall = time.monotonic() - t0
    share = (_redis_now(rdb)[1] - cpu0) / wall
    scripts = sum(g["scripts"] for g in got) / seconds
    rdb.delete(*rdb.keys("{ceiling}:*"))
    return {"replicas": replicas, "put_scripts_per_s": round(scripts), "requests_per_s": round(scripts / 2),
            "redis_cpu_share": round(share, 3), "client_bound": share < CLIENT_BOUND_SHARE,
            "requests_per_s_at_one_core": round(scripts / 2 / share) if share > 0 else None}  # fmt: skip


# -- one setting -------------------------------------------------------------------------------------------------


def measure(label: str, ports: list[int], processes: int, worker_urls: list[str], rdb: redis.Redis, pool: Any,
            client_cpus: list[int], args: argparse.Namespace,
            direct_at: dict[float, list[dict[str, Any]]]) -> dict[str, Any]:  # fmt: skip
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    common = {"stream": args.stream, "warmup_s": args.warmup, "duration_s": args.duration}
    conns = -(-args.connections * processes // len(client_cpus))  # per client: --connections per gateway process
    # The gateways' counters are read after they are published (a second apart at most), Redis's right at the runs'
    # ends; both are divided by every request completed in between, warm-ups included.
    rt0, degraded0 = _round_trips(ports), _counter(ports, "chimera_state_degraded_total")
    c0, cpu0 = _redis_now(rdb)
    t0 = time.monotonic()
    runs = [_drive(pool, client_cpus, kind="closed", urls=urls, connections=conns, **common)
            for _ in range(args.repeat)]  # fmt: skip
    c1, cpu1 = _redis_now(rdb)
    wall = time.monotonic() - t0
    rt1 = _round_trips(ports)
    sat = [p for run in runs for p in run]
    completed = sum(p["all_completed"] for p in sat)
    each = sorted(round(sum(p["rps"] for p in run), 1) for run in runs)
    row: dict[str, Any] = {
        "setting": label, "processes": processes,
        "saturation_rps": statistics.median(each), "saturation_runs": each, "errors": sum(p["errors"] for p in sat),
        "closed_loop_ms": _merged(sat, "latencies_ms"),
        "redis_commands_per_request": round((c1 - c0) / completed, 2) if completed else None,
        "gateway_round_trips_per_request": round((rt1 - rt0) / completed, 2) if completed else None,
        "redis_cpu_share": round((cpu1 - cpu0) / wall, 3),
        "degraded_events": _counter(ports, "chimera_state_degraded_total") - degraded0,  # Redis lost mid-run
        "rates": [],
    }  # fmt: skip
    for rate in args.rates:
        if rate > BUSY_SHARE * row["saturation_rps"]:
            continue
        via = _drive(pool, client_cpus, kind="open", urls=urls, rate=rate, seed=args.seed, **common)
        if rate not in direct_at:  # the workers straight, once per rate
            direct_at[rate] = _drive(pool, client_cpus, kind="open", urls=worker_urls, rate=rate, seed=args.seed,
                                     **common)  # fmt: skip
        v, d = _merged(via, "latencies_ms"), _merged(direct_at[rate], "latencies_ms")
        row["rates"].append({
            "rate": rate, "via_rps": round(sum(p["rps"] for p in via), 1), "errors": sum(p["errors"] for p in via),
            "via_ms": v, "direct_ms": d,
            "added_ms": {q: _minus(v[q], d[q]) for q in ("p50", "p99")},
        })  # fmt: skip
    print(json.dumps({k: row[k] for k in row if k != "closed_loop_ms"}), flush=True)
    return row


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    most = max([*args.replicas, *args.serve_workers])
    need = most + 1 + args.workers + args.clients
    if len(cores) < need:  # the figures then measure the sharing, not the gateways
        print(f"warning: {need} cores wanted ({most} gateways, Redis, {args.workers} workers, {args.clients} clients), "
              f"{len(cores)} here: processes share cores", file=sys.stderr)  # fmt: skip
    at = [cores[i % len(cores)] for i in range(need)]
    gw_cores, redis_core = at[:most], at[most]
    worker_cores = at[most + 1 : most + 1 + args.workers]
    client_cores = at[most + 1 + args.workers : need]
    dest = Path(args.out)
    logs = dest / "logs"
    dest.mkdir(parents=True, exist_ok=True)
    exe = args.redis_server or shutil.which("redis-server") or sys.exit("redis-server not found (--redis-server)")
    rport = free_port()
    procs: list[subprocess.Popen[bytes]] = [
        gateway_proc.start([exe, "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                           logs / "redis.log", redis_core)]  # fmt: skip
    rows: list[dict[str, Any]] = []
    try:
        wports = [free_port() for _ in worker_cores]
        for port, cpu in zip(wports, worker_cores, strict=True):
            cmd = [sys.executable, "-m", "chimera_bench.fastworker", "--port", str(port)]
            procs.append(gateway_proc.start(cmd, logs / f"worker-{port}.log", cpu))
        worker_urls = [f"http://127.0.0.1:{p}" for p in wports]
        for url in worker_urls:
            wait_ready(url + "/health")
        rdb = redis.Redis(port=rport)
        for _ in range(100):
            try:
                rdb.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        gport = free_port()
        cfg = dest / "scaling-config.yaml"
        cfg.write_text(CONFIG_HEAD.format(gw_port=gport, state=f"redis://127.0.0.1:{rport}/0?prefix=scale")
                       + "".join(BACKEND.format(i=i, port=p) for i, p in enumerate(wports)) + AGENTS)  # fmt: skip
        ctx = multiprocessing.get_context("spawn")
        direct_at: dict[float, list[dict[str, Any]]] = {}
        ceilings: list[dict[str, Any]] = []

        def save() -> None:
            cores_of = {"gateways": gw_cores, "redis": redis_core, "workers": worker_cores, "clients": client_cores}
            doc = {"cores": cores_of, "args": vars(args), "rows": rows, "summary": summary(rows),
                   "redis_ceiling": ceilings}
            (dest / "scaling.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")

        with ctx.Pool(len(client_cores)) as pool:
            for n in args.replicas:
                ports = [gport if i == 0 else free_port() for i in range(n)]
                gws = [gateway_proc.start(gateway_proc.command(str(cfg), port, policy=None),
                                          logs / f"gateway-x{n}-{i}.log", gw_cores[i])
                       for i, port in enumerate(ports)]  # fmt: skip
                try:
                    for port, proc in zip(ports, gws, strict=True):
                        wait_ready(f"http://127.0.0.1:{port}/ready", proc=proc)
                    rows.append(measure(f"replicas x{n}", ports, n, worker_urls, rdb, pool, client_cores, args,
                                        direct_at))  # fmt: skip
                finally:
                    for proc in gws:
                        gateway_proc.stop(proc, timeout_s=30.0)
                save()
            ceilings = [redis_ceiling(pool, client_cores, rport, n, len(wports)) for n in args.replicas]
            print(json.dumps({"redis_ceiling": ceilings}), flush=True)
            for n in args.serve_workers:
                cmd = [sys.executable, "-m", "router.cli", "serve", "--config", str(cfg), "--port", str(gport),
                       "--workers", str(n)]  # fmt: skip
                env = {**os.environ, "PYTHONUNBUFFERED": "1"}
                proc = gateway_proc.start(cmd, logs / f"serve-workers-{n}.log", set(gw_cores[:n]), env)
                try:
                    try:
                        gateway_proc.wait_replicas(f"http://127.0.0.1:{gport}", [proc] * n, timeout_s=30.0)
                    except ChimeraError as exc:  # the kernel may hand every connection to one process
                        print(f"warning: {exc}", file=sys.stderr)
                    rows.append(measure(f"serve --workers {n}", [gport], n, worker_urls, rdb, pool, client_cores,
                                        args, direct_at))  # fmt: skip
                finally:
                    gateway_proc.stop(proc, timeout_s=30.0)
                save()
    finally:
        for proc in procs:
            gateway_proc.stop(proc)
    for line in summary(rows):
        print(line)
    return rows


def summary(rows: list[dict[str, Any]]) -> list[str]:
    one = next((r["saturation_rps"] for r in rows if r["setting"] == "replicas x1"), None)
    out = []
    for r in rows:
        linear = None if not one else round(r["saturation_rps"] / (one * r["processes"]), 3)
        added = "; ".join(f"{x['rate']:g}/s +{x['added_ms']['p50']} / +{x['added_ms']['p99']} ms"
                          for x in r["rates"])  # fmt: skip
        out.append(f"{r['setting']}: {r['saturation_rps']:.0f}/s {r['saturation_runs']} (x{linear} of linear), "
                   f"{r['gateway_round_trips_per_request']} round trips/request "
                   f"({r['degraded_events']:g} outages), Redis "
                   f"{r['redis_commands_per_request']} commands/request at {r['redis_cpu_share']:.0%} of a core; "
                   f"{added}")  # fmt: skip
    return out


def _csv(kind: Any) -> Any:
    return lambda s: tuple(kind(x) for x in s.split(",") if x)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chimera_bench.scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--replicas", type=_csv(int), default=(1, 2, 4, 8))
    p.add_argument("--serve-workers", type=_csv(int), default=(), help="chimera serve --workers N settings")
    p.add_argument("--rates", type=_csv(float), default=(1000.0, 4000.0), help="open-loop requests/s")
    p.add_argument("--workers", type=int, default=3, help="zero-latency workers, one core each")
    p.add_argument("--clients", type=int, default=3, help="load-client processes, one core each")
    p.add_argument("--connections", type=int, default=16,
                   help="requests in flight per gateway process (saturation), spread over the clients")
    p.add_argument("--repeat", type=int, default=3, help="saturation runs per setting")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--redis-server", help="the redis-server binary (default: the PATH's)")
    p.add_argument("--out", default="bench-out/scaling")
    run(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
