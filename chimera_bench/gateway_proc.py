"""The gateway as the bench runs it: its own process, a policy overridden, optionally profiled.

    python -m chimera_bench.gateway_proc --config FILE --port P [--policy NAME] [--request-log F]
                                        [--profile OUT] [--speedup X] [--unseen]

``create_app`` over the config with ``gateway.policy`` (and the request log) replaced; the
config's ``sim:`` workers are *not* started here (the bench starts them). With ``--profile OUT``
the process runs under cProfile and writes ``OUT.prof`` and a text summary ``OUT.txt`` when it
gets SIGTERM (uvicorn's graceful shutdown).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import uvicorn

from router.core.config import SLA, Config, load_config
from router.core.errors import ChimeraError
from router.wire import SERVER_OPTIONS


def with_overrides(
    cfg: Config, *, policy: str | None = None, request_log: str | None = None, speedup: float | None = None,
    urls: dict[str, str] | None = None, state: str | None = None,
) -> Config:  # fmt: skip
    """``cfg`` with the gateway's policy / request log / state URL, every sim's speedup and some backends' URLs
    replaced."""
    gw_update: dict[str, object] = {}
    if policy is not None:
        gw_update["policy"] = policy
    if state is not None:
        gw_update["state"] = state
    if request_log is not None:
        gw_update["request_log"] = request_log or None
    backends = cfg.backends
    if speedup is not None:
        backends = tuple(
            b.model_copy(update={"sim": b.sim.model_copy(update={"speedup": speedup})}) if b.sim else b
            for b in backends
        )
    if urls:
        backends = tuple(b.model_copy(update={"url": urls[b.name]}) if b.name in urls else b for b in backends)
    return cfg.model_copy(update={"gateway": cfg.gateway.model_copy(update=gw_update), "backends": backends})


def unseen(cfg: Config) -> Config:
    """``cfg`` as a gateway in front of workers it has never seen would be configured: every backend a plain
    ``url:`` worker (no ``sim:``, ``profile:`` or ``quality:``, so nothing of the sims' profiles or speedups reaches
    the router), and every figure in modelled time in wall-clock time (divided by the fleet's sim speedup: each
    agent's SLA, the predictive policy's ``wrong_answer_s``, ``wrong_answer_stage_s`` and ``sla_miss_s``), as a
    user who measured those workers would write them."""
    speeds = {b.sim.speedup for b in cfg.backends if b.sim is not None}
    k = 1.0 / speeds.pop() if len(speeds) == 1 else 1.0
    backends = tuple(b.model_copy(update={"sim": None, "profile": None, "quality": None}) for b in cfg.backends)

    def wall(sla: SLA) -> SLA:
        return sla.model_copy(update={key: v * k for key, v in sla.model_dump().items() if v is not None})

    agents = tuple(a.model_copy(update={"sla": wall(a.sla)}) for a in cfg.agents)
    po = cfg.gateway.policy_options
    update = {"wrong_answer_s": po.wrong_answer_s * k, "wrong_answer_stage_s": po.wrong_answer_stage_s * k}
    if po.sla_miss_s is not None:
        update["sla_miss_s"] = po.sla_miss_s * k
    options = po.model_copy(update=update)
    gateway = cfg.gateway.model_copy(update={"policy_options": options})
    return cfg.model_copy(update={"backends": backends, "agents": agents, "gateway": gateway})


def command(
    config_path: str, port: int, *, policy: str | None, request_log: str | None = None,
    profile: str | None = None, speedup: float | None = None, urls: dict[str, str] | None = None,
    state: str | None = None, reuse_port: bool = False, unseen: bool = False,
) -> list[str]:  # fmt: skip
    cmd = [sys.executable, "-m", "chimera_bench.gateway_proc", "--config", config_path, "--port", str(port)]
    if unseen:
        cmd.append("--unseen")
    if policy:
        cmd += ["--policy", policy]
    if request_log is not None:
        cmd += ["--request-log", request_log]
    if profile:
        cmd += ["--profile", profile]
    if speedup is not None:
        cmd += ["--speedup", repr(speedup)]
    for name, url in (urls or {}).items():
        cmd += ["--backend-url", f"{name}={url}"]
    if state is not None:
        cmd += ["--state", state]
    if reuse_port:
        cmd.append("--reuse-port")
    return cmd


def listen(host: str, port: int) -> socket.socket:
    """A listening socket with SO_REUSEPORT, so several gateway replicas share one port (the kernel spreads
    incoming connections over them, as behind a Kubernetes Service)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def start(
    cmd: list[str], log_file: Path, cpu: int | set[int] | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a server process logging to ``log_file``, pinned to ``cpu`` (a core, or a set of them) before it runs
    (as ``taskset -c CPU``: every thread and process it starts, and a runtime's count of cores, keeps to them)."""
    from router.serve import die_with_parent

    def setup() -> None:  # in the child, before exec
        die_with_parent()  # a bench killed outright (SIGKILL, OOM) takes its servers with it
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {cpu} if isinstance(cpu, int) else cpu)

    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as err:
        return subprocess.Popen(cmd, stdout=err, stderr=err, env=env, preexec_fn=setup)


def wait_replicas(
    url: str, procs: Sequence[subprocess.Popen[bytes]], headers: dict[str, str] | None = None, timeout_s: float = 30.0
) -> None:
    """Poll ``url``'s /fleet until each of the replicas sharing its port (SO_REUSEPORT) has answered
    as itself (``replicas[].self``): a new connection per poll, so the kernel spreads the polls over
    every listening process. /ready alone cannot tell: the first replica up answers for all, and a
    client's keep-alive connections opened before the others listen stay on it for the whole run."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < len(procs):
        for proc in procs:
            if proc.poll() is not None:
                raise ChimeraError(f"a gateway replica on {url} exited with status {proc.returncode}")
        try:
            body = httpx.get(url + "/fleet", timeout=1.0, headers=headers).json()
            seen |= {r["id"] for r in body.get("replicas", []) if r.get("self")}
        except (httpx.HTTPError, ValueError, TypeError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise ChimeraError(f"{len(seen)} of {len(procs)} gateway replicas on {url} answered within {timeout_s:g} s")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Send a running ``proc`` ``sig``, and kill it if it has not ended within ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chimera_bench.gateway_proc")
    p.add_argument("--config", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--policy")
    p.add_argument("--request-log")
    p.add_argument("--profile")
    p.add_argument("--speedup", type=float)
    p.add_argument("--backend-url", action="append", default=[], metavar="NAME=URL", help="move a backend")
    p.add_argument("--state", help="replace gateway.state (e.g. a redis:// URL with its own prefix)")
    p.add_argument("--reuse-port", action="store_true", help="share the port with other replicas (SO_REUSEPORT)")
    p.add_argument("--unseen", action="store_true", help="no sim profiles, speedups or qualities (see unseen)")
    args = p.parse_args(argv)
    urls = dict(item.split("=", 1) for item in args.backend_url)
    cfg = with_overrides(
        load_config(args.config), policy=args.policy, request_log=args.request_log, speedup=args.speedup, urls=urls,
        state=args.state,
    )  # fmt: skip
    if args.unseen:
        cfg = unseen(cfg)
    from router.app import create_app

    app = create_app(cfg)  # served as `chimera serve` serves it (router.wire.SERVER_OPTIONS)
    if args.reuse_port:
        server = uvicorn.Server(uvicorn.Config(app, **SERVER_OPTIONS))
        server.run(sockets=[listen(args.host, args.port)])
        return 0
    if not args.profile:
        uvicorn.run(app, host=args.host, port=args.port, **SERVER_OPTIONS)
        return 0
    # uvicorn re-raises the SIGTERM it caught once it has shut down; a no-op handler lets the
    # profile below be written instead of the process dying on the spot.
    signal.signal(signal.SIGTERM, lambda *_: None)
    prof = cProfile.Profile()
    prof.enable()
    try:
        uvicorn.run(app, host=args.host, port=args.port, **SERVER_OPTIONS)
    finally:
        prof.disable()
        out = Path(args.profile)
        prof.dump_stats(str(out.with_suffix(".prof")))
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf).strip_dirs()
        buf.write("== by own time (tottime) ==\n")
        stats.sort_stats("tottime").print_stats(35)
        buf.write("== by cumulative time ==\n")
        stats.sort_stats("cumulative").print_stats(35)
        out.with_suffix(".txt").write_text(buf.getvalue(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
