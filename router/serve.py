"""`chimera serve`: start the config's simulated workers (and keep them running), then run the gateway under
uvicorn."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import functools
import inspect
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from backends.listen import check_free, listen, where
from backends.sim.api import PID_HEADER
from router.core import paths
from router.core.config import BackendConfig, Config, load_config
from router.core.errors import ArtifactError, ChimeraError, ConfigError
from router.core.stateurl import redacted
from router.logqueue import BatchedLogQueue
from router.metrics import MULTIPROC_ENV
from router.requestlog import check_writable
from router.wire import SERVER_OPTIONS

log = logging.getLogger("chimera.serve")

CONFIG_ENV = "CHIMERA_CONFIG"  # how `--workers N` hands the config path to each uvicorn worker


def sim_command(backend: BackendConfig, *colocated: BackendConfig) -> list[str]:
    """The `chimera sim` command line that serves ``backend`` as a simulated worker.

    ``colocated``: more ``sim:`` backends on the same GPU, served by the same process (``--also``)
    on one shared GPU clock (the config has checked that they share its speedup).
    """
    spec = backend.sim
    assert spec is not None
    cmd = [sys.executable, "-m", "router.cli", "sim", "--port", str(backend.port), "--speedup", repr(spec.speedup)]
    for key, value in _sim_settings(backend):
        cmd += ["--" + key.replace("_", "-"), value]
    for b in colocated:
        cmd += ["--also", ",".join(f"{key}={value}" for key, value in [("port", str(b.port)), *_sim_settings(b)])]
    return cmd


def _sim_settings(b: BackendConfig) -> list[tuple[str, str]]:
    """A ``sim:`` backend's `chimera sim` settings as (name, value): the first worker's flags, an ``--also``
    item's keys."""
    s = b.sim
    assert s is not None
    out = [("host", b.host), ("model", b.model), ("profile", s.profile), ("seed", str(s.seed)),
           ("kv_tokens", str(s.kv_tokens or b.kv_budget_tokens)), ("max_model_len", str(b.max_model_len))]  # fmt: skip
    if s.max_num_seqs:
        out.append(("max_num_seqs", str(s.max_num_seqs)))
    if s.max_num_batched_tokens:
        out.append(("max_num_batched_tokens", str(s.max_num_batched_tokens)))
    if b.scheduling_policy != "fcfs":
        out.append(("scheduling_policy", b.scheduling_policy))
    if b.engine not in (None, "vllm"):
        out.append(("engine", b.engine))
    if s.runner != "generate":
        out.append(("runner", s.runner))
    return out


def sim_groups(backends: Sequence[BackendConfig]) -> list[list[BackendConfig]]:
    """The ``sim:`` backends by process: those with the same ``gpu`` share one (and one GPU clock);
    a backend without ``gpu`` gets a process, and a GPU, of its own. In config order."""
    groups: list[list[BackendConfig]] = []
    by_gpu: dict[int, list[BackendConfig]] = {}
    for b in backends:
        if b.sim is None:
            continue
        if b.gpu is None:
            groups.append([b])
        elif b.gpu in by_gpu:
            by_gpu[b.gpu].append(b)
        else:
            by_gpu[b.gpu] = [b]
            groups.append(by_gpu[b.gpu])
    return groups


@contextlib.contextmanager
def running_sims(
    backends: Sequence[BackendConfig], *, timeout_s: float = 30.0, backoff: Backoff | None = None
) -> Iterator[SimSupervisor]:
    """Start a `chimera sim` process per group of ``sim:`` backends (:func:`sim_groups`: one per GPU);
    wait for each one's /health; keep them running (:class:`SimSupervisor`: one that exits is started
    again after ``backoff``); stop them on exit. A port already taken fails here, naming the backend,
    before any is started (else /health would be answered by whoever holds it)."""
    groups = sim_groups(backends)
    for b in (b for group in groups for b in group):
        try:
            check_free(b.host, b.port)
        except ChimeraError as exc:
            raise ChimeraError(f"simulated worker {b.name}: {exc}") from exc
    supervisor = SimSupervisor(backoff or Backoff())
    try:
        for group in groups:
            supervisor.add(group)
        deadline = time.monotonic() + timeout_s
        for group, p in zip(groups, supervisor.processes(), strict=True):
            for b in group:
                _wait_healthy(b, p, deadline)
                log.info("simulated worker %s (%s, %s) is up at %s%s", b.name, b.model, b.sim and b.sim.profile,
                         b.url, f" sharing gpu {b.gpu}" if len(group) > 1 else "")  # fmt: skip
        supervisor.start()
        yield supervisor
    finally:
        supervisor.stop()


@dataclasses.dataclass(frozen=True)
class Backoff:
    """When a simulated worker that exited starts again: ``first_s`` after its exit, doubling with every exit
    up to ``max_s``; one that had stayed up ``stable_s`` starts over from ``first_s``."""

    first_s: float = 0.5
    max_s: float = 30.0
    stable_s: float = 30.0

    def delay(self, previous_s: float | None, up_s: float) -> float:
        """The wait before the next start, given the previous wait (None: none yet) and how long it ran."""
        if previous_s is None or up_s >= self.stable_s:
            return self.first_s
        return min(self.max_s, previous_s * 2)


@dataclasses.dataclass
class _Sim:
    """One `chimera sim` process (a group of ``sim:`` backends) and where its restarts stand."""

    group: list[BackendConfig]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    delay_s: float | None = None  # the last wait before a restart
    restart_at: float | None = None  # set while it is down
    last_line: str = ""  # its stderr's last line (the reason it gives when it exits)
    partial: bytes = b""

    @property
    def label(self) -> str:
        return ("simulated worker " if len(self.group) == 1 else "simulated workers ") + ", ".join(
            b.name for b in self.group
        )


class SimSupervisor:
    """The simulated workers `chimera serve` runs, kept running by one thread (off the event loop): it drains
    each one's stderr (a full pipe would stall the worker), reaps one that exits, logs it once and starts it
    again on the same port after :class:`Backoff`. Meanwhile the gateway's prober ejects it, then re-admits it
    once its /health answers. :meth:`stop` stops the thread before the workers: none starts during shutdown."""

    def __init__(self, backoff: Backoff, poll_s: float = 0.1) -> None:
        self.backoff = backoff
        self._poll_s = poll_s
        self._sims: list[_Sim] = []
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._selector = selectors.DefaultSelector()

    def processes(self) -> list[subprocess.Popen[bytes]]:
        """The processes running now, in config order (one that is down is absent)."""
        return [s.proc for s in self._sims if s.proc is not None]

    def add(self, group: list[BackendConfig]) -> None:
        """Start the process serving ``group`` (before :meth:`start`)."""
        sim = _Sim(group)
        self._sims.append(sim)
        self._spawn(sim)

    def start(self) -> None:
        for sim in self._sims:
            self._watch(sim)
        self._thread = threading.Thread(target=self._run, name="chimera-sim-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop restarting, then stop every worker: SIGTERM, SIGKILL after 5 s."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        procs = self.processes()
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for sim in self._sims:
            self._unwatch(sim)
        self._selector.close()

    def _spawn(self, sim: _Sim) -> None:
        _prctl()  # looked up here, before the fork: the child only calls it
        # Its own session: the terminal's Ctrl-C reaches the gateway alone, which drains its requests, then
        # stops the workers. Spawned by the supervising thread, a restarted worker gets its SIGTERM from
        # PR_SET_PDEATHSIG when that thread ends, which it does only in stop().
        sim.proc = subprocess.Popen(sim_command(*sim.group), stderr=subprocess.PIPE, preexec_fn=die_with_parent,
                                    start_new_session=True)  # fmt: skip
        sim.started, sim.restart_at, sim.last_line, sim.partial = time.monotonic(), None, "", b""

    def _run(self) -> None:
        while not self._stopping.is_set():
            if self._selector.get_map():
                for key, _ in self._selector.select(self._poll_s):
                    self._drain(key.data)
            else:
                self._stopping.wait(self._poll_s)
            now = time.monotonic()
            for sim in self._sims:
                if sim.proc is not None and (status := sim.proc.poll()) is not None:
                    self._exited(sim, _status(status), now, said=status >= 0)  # a signal is reason enough
                if sim.restart_at is not None and now >= sim.restart_at and not self._stopping.is_set():
                    self._restart(sim, now)

    def _exited(self, sim: _Sim, reason: str, now: float, *, said: bool = False) -> None:
        """Log ``sim``'s exit once and set its restart (``said``: its last line on stderr is why it exited)."""
        if sim.proc is not None:
            self._drain(sim)
            self._unwatch(sim)
        sim.proc = None
        sim.delay_s = self.backoff.delay(sim.delay_s, now - sim.started)
        sim.restart_at = now + sim.delay_s
        if said and sim.last_line:
            reason += f": {sim.last_line}"
        log.warning("%s exited (%s); restarting in %g s", sim.label, reason, sim.delay_s)

    def _restart(self, sim: _Sim, now: float) -> None:
        try:
            self._spawn(sim)
        except OSError as exc:  # no process at all (out of pids, of file descriptors): a try like any other
            sim.started = now
            self._exited(sim, f"could not start: {exc}", now)
            return
        self._watch(sim)
        assert sim.proc is not None
        log.info("%s restarted (pid %d)", sim.label, sim.proc.pid)

    def _watch(self, sim: _Sim) -> None:
        if sim.proc is not None and sim.proc.stderr is not None:
            os.set_blocking(sim.proc.stderr.fileno(), False)
            self._selector.register(sim.proc.stderr, selectors.EVENT_READ, sim)

    def _unwatch(self, sim: _Sim) -> None:
        pipe = sim.proc.stderr if sim.proc is not None else None
        if pipe is not None and not pipe.closed:
            with contextlib.suppress(KeyError):
                self._selector.unregister(pipe)
            pipe.close()

    def _drain(self, sim: _Sim) -> None:
        """Read what ``sim``'s stderr holds now, keeping its last line."""
        pipe = sim.proc.stderr if sim.proc is not None else None
        if pipe is None or pipe.closed:
            return
        while True:
            try:
                chunk = os.read(pipe.fileno(), 65536)
            except BlockingIOError:
                return
            if not chunk:  # its end: an unfinished last line counts too
                if sim.partial.strip():
                    sim.last_line = sim.partial.decode(errors="replace").strip()[:500]
                self._unwatch(sim)
                return
            lines = (sim.partial + chunk).split(b"\n")
            sim.partial = lines.pop()[-4096:]
            if last := next((line for line in reversed(lines) if line.strip()), None):
                sim.last_line = last.decode(errors="replace").strip()[:500]


def _status(returncode: int) -> str:
    """``status 1``, or ``status -9, SIGKILL`` for a process a signal ended."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"status {returncode}, {signal.Signals(-returncode).name}"
    return f"status {returncode}"


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's prctl, or None off Linux. Looked up once in the gateway: a lookup (dlopen) in a child forked
    while another thread holds the loader's lock would never return."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return fn


def die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM it when the gateway dies, even by SIGKILL."""
    prctl = _prctl()
    if prctl is not None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # uvicorn handles SIGTERM itself while serving, then re-raises it: exit normally so that the
    # simulated workers are stopped by running_sims' cleanup instead of being orphaned.
    raise SystemExit(0)


def _wait_healthy(b: BackendConfig, p: subprocess.Popen[bytes], deadline: float) -> None:
    """Until ``b``'s /health is answered by ``p`` itself (its pid in the answer: another process that took
    the port in the meantime does not count); raise if ``p`` exits first or time runs out."""
    foreign = False
    while True:
        if p.poll() is not None:
            err = (p.stderr.read() if p.stderr else b"").decode(errors="replace").strip().splitlines()
            raise ChimeraError(f"simulated worker {b.name} exited: {err[-1] if err else p.returncode}")
        try:
            r = httpx.get(b.url + paths.WORKER_HEALTH, timeout=1.0)
            if r.status_code == 200 and r.headers.get(PID_HEADER) == str(p.pid):
                return
            foreign = r.status_code == 200
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            by = " (another process answers there)" if foreign else ""
            raise ChimeraError(f"simulated worker {b.name} did not become healthy at {b.url}{by}")
        time.sleep(0.1)


def app_factory() -> Starlette:
    """uvicorn ``--factory`` entry for multi-process serving: the config path comes from the env.
    Each worker process is spawned afresh, so it sets up its logging as ``serve`` does (else its
    root logger would stay at WARNING and drop every audit line); what is queued is written at exit."""
    from router.app import create_app

    _configure_logging()
    logs = contextlib.ExitStack()
    logs.enter_context(_log_off_the_loop())
    atexit.register(logs.close)
    app: Starlette = create_app(load_config(os.environ[CONFIG_ENV]))
    return app


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2"):  # one line per probe is noise
        logging.getLogger(noisy).setLevel(logging.WARNING)


def serve(
    cfg: Config,
    *,
    config_path: str,
    host: str | None = None,
    port: int | None = None,
    workers: int = 1,
    start_sims: bool = True,
) -> None:
    _configure_logging()
    with _log_off_the_loop():
        _serve(cfg, config_path=config_path, host=host, port=port, workers=workers, start_sims=start_sims)


@contextlib.contextmanager
def _log_off_the_loop() -> Iterator[None]:
    """Route the root logger through a deque to a thread that writes in batches (router.logqueue),
    so an audit or warning line costs the event loop a deque append, not a blocking write to stderr
    nor a thread wake-up; restored on the way out, after what is queued is written."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    queue = BatchedLogQueue(handlers)
    root.handlers = [queue.handler]
    try:
        with queue:
            yield
    finally:
        root.handlers = handlers


def _serve(cfg: Config, *, config_path: str, host: str | None, port: int | None, workers: int,
           start_sims: bool) -> None:  # fmt: skip
    from router.app import create_app
    from router.checks import exposure

    host = host or cfg.gateway.host
    for line in exposure(cfg, host):  # (a gateway open to whoever reaches it: said, not refused)
        log.warning("%s", line)
    port = cfg.gateway.port if port is None else port
    preflight(cfg, config_path)  # one line now, not a traceback from the app's start-up
    sockets = listen([(host, port)])  # then the port: taken, it fails before the sims start
    if workers > 1 and cfg.gateway.state == "memory":
        log.warning("--workers %d with state: memory — each process keeps its own view of the fleet; "
                    "use a redis:// state to share it", workers)  # fmt: skip
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with running_sims(cfg.backends if start_sims else ()):
            log.info("chimera gateway on http://%s (policy %s, state %s)", where(host, sockets[0].getsockname()[1]),
                     cfg.gateway.policy, redacted(cfg.gateway.state))  # fmt: skip
            if workers == 1:
                _run(uvicorn.Config(create_app(cfg), **SERVER_OPTIONS), sockets)
            else:
                os.environ[CONFIG_ENV] = os.path.abspath(config_path)
                config = uvicorn.Config("router.serve:app_factory", factory=True, workers=workers, **SERVER_OPTIONS)
                with _shared_metrics():
                    _run_processes(config, sockets)
    finally:
        for sock in sockets:
            sock.close()


def preflight(cfg: Config, config_path: str, *, request_log: bool = True, warn: bool = True) -> None:
    """What the gateway's start-up would fail on, checked before anything starts: the request log opens
    (ChimeraError; ``request_log=False``: a caller that logs elsewhere) and ``gateway.predictor.model``
    loads (ConfigError naming the key, exit 2); ``gateway.policy`` is a registered policy. Logs a warning
    for every option that does nothing where it stands (router.checks)."""
    from router.checks import inert_options
    from router.policies import check_policy

    check_policy(cfg)
    for line in inert_options(cfg) if warn else ():  # warn=False: the bench, which swaps the policy per run
        log.warning("%s", line)
    if request_log:
        check_writable(cfg.gateway.request_log)
    pc = cfg.gateway.predictor
    if pc is not None and pc.model:
        from predictor import artifact

        try:
            artifact.load(pc.model)
        except ArtifactError as exc:
            raise ConfigError(str(exc), file=config_path, key="gateway.predictor.model") from None


@contextlib.contextmanager
def _shared_metrics() -> Iterator[None]:
    """``--workers N``: the worker processes keep their Prometheus values in one fresh directory, and each
    answers /metrics with the sum over all (router.metrics). A directory the user set is kept as it is."""
    if os.environ.get(MULTIPROC_ENV):
        yield
        return
    path = tempfile.mkdtemp(prefix="chimera-metrics-")
    os.environ[MULTIPROC_ENV] = path
    try:
        yield
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


def _run(config: uvicorn.Config, sockets: list[socket.socket]) -> None:
    """Serve on ``sockets`` in this process until interrupted, as ``uvicorn.run`` would; an app whose
    start-up fails (uvicorn logs why, then exits with its status 3) is a :class:`ChimeraError`."""
    server = uvicorn.Server(config)
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:
        if server.started or exc.code in (None, 0):
            raise
        raise ChimeraError("the gateway did not start (its start-up failed: see above)") from None


def _run_processes(config: uvicorn.Config, sockets: list[socket.socket]) -> None:
    """``--workers N``: uvicorn's supervisor, spawning ``config.workers`` processes that share ``sockets``."""
    from uvicorn.supervisors import Multiprocess

    options: dict[str, Any] = {"sockets": sockets}
    if "target" in inspect.signature(Multiprocess).parameters:  # uvicorn < 0.36 wants the server's run
        options["target"] = uvicorn.Server(config).run
    try:
        Multiprocess(config, **options).run()
    except KeyboardInterrupt:
        pass
