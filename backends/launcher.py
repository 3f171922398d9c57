"""`chimera workers up`: start the real vLLM workers a config declares with ``launch:``.

Each worker is ``python -m vllm.entrypoints.openai.api_server`` in its own process group, pinned to
its GPU (``CUDA_VISIBLE_DEVICES``), with a fixed KV budget (``--kv-cache-memory-bytes``) so the
gateway's ``kv_budget_tokens`` can be exact. After ``/health`` answers, the KV capacity vLLM really
allocated is read from ``vllm:cache_config_info`` (``num_gpu_blocks * block_size``), or from the
log's ``GPU KV cache size: N tokens``, and compared with the config.

The two things this machine may lack are seams: :class:`Machine` answers which GPUs exist and
whether vLLM is importable, and ``spawn`` starts a process. Everything else is real (ports, process
groups, HTTP), so tests drive it with a stand-in ``vllm`` package on ``PYTHONPATH``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from router.core import paths
from router.core.config import BackendConfig, Config
from router.core.errors import ConfigError, LaunchError

ENTRY_POINT = "vllm.entrypoints.openai.api_server"
GIB = 1024**3
OOM_PATTERNS = ("CUDA out of memory", "OutOfMemoryError", "No available memory for the cache blocks",
                "is less than desired GPU memory utilization")  # fmt: skip
_KV_LOG_RE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_LABEL_RE = r'\b{}="(\d+)"'


#: vLLM's tool-call parser per model family (by the Hugging Face name, lower case): agent frameworks send
#: ``tool_choice: auto``, which vLLM refuses unless it runs with ``--enable-auto-tool-choice --tool-call-parser``.
TOOL_CALL_PARSERS = (("qwen", "hermes"), ("hermes", "hermes"), ("llama-3", "llama3_json"), ("mistral", "mistral"),
                     ("granite", "granite"), ("internlm", "internlm"), ("deepseek-v3", "deepseek_v3"))  # fmt: skip


def tool_calling_args(hf_model: str, extra_args: Sequence[str]) -> list[str]:
    """vLLM's flags for tool calling with the parser of ``hf_model``'s family; none where ``extra_args``
    sets them itself or the family is not known (give ``--tool-call-parser`` in ``launch.extra_args``)."""
    if any(a.startswith(("--tool-call-parser", "--enable-auto-tool-choice")) for a in extra_args):
        return []
    name = hf_model.lower()
    parser = next((p for family, p in TOOL_CALL_PARSERS if family in name), None)
    return [] if parser is None else ["--enable-auto-tool-choice", "--tool-call-parser", parser]


@dataclass(frozen=True)
class WorkerPlan:
    """Everything needed to start one worker; ``env`` holds only the variables set on top of ours."""

    backend: BackendConfig
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_path: Path

    @property
    def name(self) -> str:
        return self.backend.name

    def shell(self) -> str:
        """The command as one line a user could paste into a shell (the worker's API key shown as ***)."""
        env = " ".join(f"{k}={'***' if k == 'VLLM_API_KEY' else shlex.quote(v)}" for k, v in self.env.items())
        return f"{env} {shlex.join(self.argv)}".strip()


@dataclass(frozen=True)
class KvCheck:
    name: str
    configured: int
    actual: int | None
    source: str  # "metrics" | "log" | "unknown"

    @property
    def matches(self) -> bool:
        return self.actual is not None and self.actual == self.configured

    def message(self) -> str:
        if self.actual is None:
            return f"worker {self.name}: could not read its KV capacity (no vllm:cache_config_info, no log line)"
        if self.matches:
            return f"worker {self.name}: KV capacity {self.actual:,} tokens, as configured"
        return (f"worker {self.name}: vLLM allocated {self.actual:,} KV tokens ({self.source}) but the config says "
                f"kv_budget_tokens: {self.configured} — set kv_budget_tokens: {self.actual}")  # fmt: skip


class Machine:
    """What the host has: GPUs (by ``nvidia-smi`` and ``CUDA_VISIBLE_DEVICES``) and vLLM."""

    def __init__(self, python: str = sys.executable, env: Mapping[str, str] | None = None) -> None:
        self.python = python
        self.env = dict(os.environ if env is None else env)

    def gpus(self) -> list[str]:
        """Device ids a worker may be pinned to, in index order; [] when there is no GPU."""
        visible = self.env.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            ids = [d.strip() for d in visible.split(",") if d.strip()]
            return [] if ids in ([], ["-1"]) else ids
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20, env=self.env)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return []
        return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []

    def has_vllm(self) -> bool:
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
        try:
            return subprocess.run([self.python, "-c", probe], env=self.env, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False


def kv_cache_bytes(gib: float) -> int:
    return int(gib * GIB)


def plan_workers(cfg: Config, *, python: str = sys.executable, log_dir: str | Path = "logs/workers",
                 env: Mapping[str, str] | None = None) -> list[WorkerPlan]:  # fmt: skip
    """The command and environment of every ``launch:`` backend (no machine checks)."""
    env = os.environ if env is None else env
    launched = [b for b in cfg.backends if b.launch is not None]
    per_gpu: dict[int, int] = {}
    for b in launched:
        assert b.launch is not None
        per_gpu[b.launch.gpu] = per_gpu.get(b.launch.gpu, 0) + 1
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    cache_root = env.get("VLLM_CACHE_ROOT") or str(Path.home() / ".cache" / "vllm")
    plans = []
    for b in launched:
        spec = b.launch
        assert spec is not None
        argv = [python, "-m", ENTRY_POINT, "--model", spec.hf_model, "--served-model-name", b.model,
                "--host", b.host, "--port", str(b.port), "--max-model-len", str(b.max_model_len),
                "--kv-cache-memory-bytes", str(kv_cache_bytes(spec.kv_cache_gib))]  # fmt: skip
        # vLLM refuses to start unless gpu_memory_utilization x the card is free, even with a fixed KV
        # budget: workers sharing a GPU each ask for their share unless extra_args says otherwise.
        if per_gpu[spec.gpu] > 1 and not any(a.startswith("--gpu-memory-utilization") for a in spec.extra_args):
            argv += ["--gpu-memory-utilization", f"{int(90 / per_gpu[spec.gpu]) / 100:.2f}"]
        if b.scheduling_policy != "fcfs" and not any(a.startswith("--scheduling-policy") for a in spec.extra_args):
            argv += ["--scheduling-policy", b.scheduling_policy]
        argv += tool_calling_args(spec.hf_model, spec.extra_args)
        argv += spec.extra_args
        device = visible[spec.gpu] if spec.gpu < len(visible) else str(spec.gpu)
        plans.append(WorkerPlan(
            backend=b, argv=tuple(argv), log_path=Path(log_dir) / f"{b.name}.log",
            # one compile cache per worker: two processes writing one cache race on its files
            env={"CUDA_VISIBLE_DEVICES": device, "VLLM_CACHE_ROOT": f"{cache_root}/chimera-{b.name}",
                 **({"VLLM_API_KEY": b.api_key} if b.api_key else {})},  # (vLLM's env var: not in `ps`)
        ))  # fmt: skip
    return plans


def preflight(plans: Sequence[WorkerPlan], machine: Machine) -> None:
    """Refuse to start anything that cannot work: ConfigError (exit 2) or LaunchError (exit 1)."""
    if not plans:
        raise ConfigError("no backend declares launch: — nothing to start", key="backends[].launch")
    if not machine.has_vllm():
        raise LaunchError(f"vLLM is not installed for {machine.python} (pip install -e '.[gpu]')")
    gpus = machine.gpus()
    if not gpus:
        raise LaunchError("no GPU: nvidia-smi finds none (or CUDA_VISIBLE_DEVICES hides them all)")
    for p in plans:
        assert p.backend.launch is not None
        if p.backend.launch.gpu >= len(gpus):
            raise ConfigError(f"GPU {p.backend.launch.gpu} is out of range: this machine has {len(gpus)} "
                              f"(0-{len(gpus) - 1})", key=f"backends[{p.name}].launch.gpu")  # fmt: skip
        _check_port_free(p)


def _check_port_free(p: WorkerPlan) -> None:
    host = "0.0.0.0" if p.backend.host in ("0.0.0.0", "") else p.backend.host
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is not "taken"
        try:
            s.bind((host, p.backend.port))
        except OSError as exc:
            why = "is taken" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
            raise LaunchError(f"worker {p.name}: port {p.backend.port} on {host} {why}") from None


Spawn = Callable[[WorkerPlan, IO[bytes]], "subprocess.Popen[bytes]"]


def spawn_process(plan: WorkerPlan, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start one worker in its own session, so it and its engine children stop as one group."""
    return subprocess.Popen(plan.argv, env={**os.environ, **plan.env}, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip


@dataclass
class Worker:
    plan: WorkerPlan
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    started: float = field(default_factory=time.monotonic)

    def last_log_line(self) -> str:
        lines = [ln for ln in _tail(self.plan.log_path).splitlines() if ln.strip()]
        return lines[-1].strip() if lines else "(empty log)"

    def oom_line(self) -> str | None:
        return next((ln.strip() for ln in _tail(self.plan.log_path).splitlines()
                     if any(pat in ln for pat in OOM_PATTERNS)), None)  # fmt: skip


@contextlib.contextmanager
def running_workers(
    plans: Sequence[WorkerPlan], *, spawn: Spawn = spawn_process, timeout_s: float = 900.0, poll_s: float = 0.5,
    on_up: Callable[[Worker], None] | None = None,
) -> Iterator[list[Worker]]:  # fmt: skip
    """Start every worker at once, wait until all answer /health, and stop them all on exit."""
    workers: list[Worker] = []
    try:
        for p in plans:
            p.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = p.log_path.open("wb")
            workers.append(Worker(p, spawn(p, log), log))
        wait_healthy(workers, timeout_s=timeout_s, poll_s=poll_s, on_up=on_up)
        yield workers
    finally:
        stop_all(workers)


def wait_healthy(workers: Sequence[Worker], *, timeout_s: float, poll_s: float = 0.5,
                 on_up: Callable[[Worker], None] | None = None) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout_s
    pending = list(workers)
    with httpx.Client(timeout=2.0) as http:
        while pending:
            for w in list(pending):
                check_alive(w)
                try:
                    ok = http.get(w.plan.backend.url + paths.WORKER_HEALTH).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    pending.remove(w)
                    if on_up is not None:
                        on_up(w)
            if pending and time.monotonic() > deadline:
                w = pending[0]
                raise LaunchError(f"worker {w.plan.name} not healthy at {w.plan.backend.url} after {timeout_s:g} s; "
                                  f"last log line: {w.last_log_line()}")  # fmt: skip
            if pending:
                time.sleep(poll_s)


def check_alive(w: Worker) -> None:
    """Raise a one-line LaunchError if the worker exited or its log shows it ran out of GPU memory."""
    code = w.proc.poll()
    oom = w.oom_line()
    if oom is not None:
        raise LaunchError(f"worker {w.plan.name}: out of GPU memory at start — lower launch.kv_cache_gib or free "
                          f"GPU {w.plan.env['CUDA_VISIBLE_DEVICES']} (log: {_clip(oom)})")  # fmt: skip
    if code is not None:
        raise LaunchError(f"worker {w.plan.name} exited with code {code} ({w.plan.log_path}): "
                          f"{_clip(w.last_log_line())}")  # fmt: skip


def stop_all(workers: Sequence[Worker], grace_s: float = 20.0) -> None:
    """SIGTERM each worker's process group, then SIGKILL what is left after ``grace_s``."""
    for w in workers:
        _signal_group(w.proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for w in workers:
        try:
            w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(w.proc, signal.SIGKILL)
            w.proc.wait()
        _signal_group(w.proc, signal.SIGKILL)  # engine children the parent left behind
        w.log.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def kv_capacity(w: Worker, http: httpx.Client) -> KvCheck:
    """The KV tokens vLLM really allocated: metrics first, the start-up log second."""
    configured = w.plan.backend.kv_budget_tokens
    with contextlib.suppress(httpx.HTTPError):
        actual = kv_tokens_from_metrics(http.get(w.plan.backend.url + paths.WORKER_METRICS).text)
        if actual is not None:
            return KvCheck(w.plan.name, configured, actual, "metrics")
    actual = kv_tokens_from_log(_tail(w.plan.log_path, 1 << 20))
    return KvCheck(w.plan.name, configured, actual, "log" if actual is not None else "unknown")


def kv_tokens_from_metrics(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            blocks = re.search(_LABEL_RE.format("num_gpu_blocks"), line)
            size = re.search(_LABEL_RE.format("block_size"), line)
            if blocks and size:
                return int(blocks.group(1)) * int(size.group(1))
    return None


def kv_tokens_from_log(text: str) -> int | None:
    found = _KV_LOG_RE.findall(text)
    return int(found[-1].replace(",", "")) if found else None


def _tail(path: Path, size: int = 65536) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _clip(text: str, n: int = 300) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
