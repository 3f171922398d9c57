"""`chimera serve` / `chimera sim` facing a taken or impossible port, bad sim flags, and the
config's ``max_model_len`` reaching the simulated workers: real processes where the wire matters."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.listen import free_port, wait_ready
from backends.sim.api import PID_HEADER as SIM_PID_HEADER
from router.cli import _build_parser, main, sim_workers
from router.core.config import BackendConfig
from router.core.errors import ChimeraError
from router.serve import _wait_healthy, sim_command, sim_groups
from tests.conftest import interrupt, make_config, serve_asgi

ROOT = Path(__file__).resolve().parents[1]


def _chimera(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "router.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@contextlib.contextmanager
def _taken_port() -> Iterator[int]:
    """A loopback port another process-like owner listens on (no SO_REUSEADDR: as a foreign server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _gateway_yaml(tmp_path: Path, gw: int, worker: int, *, sim: bool) -> Path:
    cfg = tmp_path / "gw.yaml"
    sim_part = ", sim: {profile: h200-qwen2.5-0.5b, speedup: 5}" if sim else ""
    cfg.write_text(
        f"gateway: {{port: {gw}, policy: round_robin, default_agent: chat}}\n"
        f'backends:\n  - {{name: s1, url: "http://127.0.0.1:{worker}", model: m, kv_budget_tokens: 100000{sim_part}}}\n'
        "agents:\n  - {name: chat, models: [m]}\n"
    )
    return cfg


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


# 1. A port already in use: exit 1 with one line, before anything starts or is logged.


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_a_taken_port_is_one_line_exit_1(tmp_path: Path, workers: str) -> None:
    with _taken_port() as port:
        cfg = _gateway_yaml(tmp_path, port, free_port(), sim=False)
        proc = _chimera("serve", "--config", str(cfg), "--workers", workers)
    assert proc.returncode == 1
    assert _one_line(proc.stderr) == f"chimera: error: cannot listen on 127.0.0.1:{port}: address already in use"


def test_serve_with_an_unwritable_request_log_is_one_line_exit_1(tmp_path: Path) -> None:
    cfg = _gateway_yaml(tmp_path, free_port(), free_port(), sim=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # its "directory" is a file: nothing can be created under it
    cfg.write_text(cfg.read_text().replace("gateway: {", f"gateway: {{request_log: '{blocker}/logs/r.jsonl', "))
    proc = _chimera("serve", "--config", str(cfg))
    assert proc.returncode == 1
    assert _one_line(proc.stderr).startswith(f"chimera: error: cannot open the request log '{blocker}/logs/r.jsonl'")


def test_serve_with_a_predictor_model_that_does_not_load_is_one_line_exit_2(tmp_path: Path) -> None:
    cfg = _gateway_yaml(tmp_path, free_port(), free_port(), sim=False)
    (tmp_path / "cut.pkl").write_bytes(b"\x80\x05\x95")  # a truncated pickle
    for model in ("missing.pkl", "cut.pkl"):
        cfg.write_text(cfg.read_text().split("gateway: {")[0] + "gateway: {predictor: {model: '"
                       + str(tmp_path / model) + "'}, " + cfg.read_text().split("gateway: {", 1)[1])  # fmt: skip
        proc = _chimera("serve", "--config", str(cfg))
        assert proc.returncode == 2, proc.stderr
        line = _one_line(proc.stderr)
        assert line.startswith(f"chimera: error: {cfg}: gateway.predictor.model: {tmp_path / model}: cannot read"), line
        cfg = _gateway_yaml(tmp_path, free_port(), free_port(), sim=False)


def test_sim_on_a_taken_port_is_one_line_exit_1() -> None:
    with _taken_port() as port:
        proc = _chimera("sim", "--port", str(port))
        assert proc.returncode == 1
        assert _one_line(proc.stderr) == f"chimera: error: cannot listen on 127.0.0.1:{port}: address already in use"
        other = free_port()
        proc = _chimera("sim", "--port", str(other), "--also", f"port={port}")  # a co-located worker's port
    assert proc.returncode == 1
    assert _one_line(proc.stderr) == f"chimera: error: cannot listen on 127.0.0.1:{port}: address already in use"


@pytest.mark.parametrize(
    "args",
    [
        ["sim", "--port", "99999"],
        ["sim", "--port", "-1"],
        ["sim", "--port", str(free_port()), "--also", "port=65536"],
        ["serve", "--config", "examples/quickstart.yaml", "--port", "99999"],
    ],
)
def test_port_out_of_range_is_rejected_at_parsing(args: list[str]) -> None:
    proc = _chimera(*args, timeout=15)  # it used to hang, silent
    assert proc.returncode == 2
    assert "0..65535" in _one_line(proc.stderr)


# 2. `chimera serve` never adopts someone else's server on a sim: backend's port.


async def _health_ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Another server on the port, answering every request 200."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def test_serve_refuses_a_sim_port_another_server_holds(tmp_path: Path) -> None:
    gw = free_port()
    with serve_asgi(_health_ok, lifespan="off") as foreign:
        cfg = _gateway_yaml(tmp_path, gw, foreign.port, sim=True)
        proc = _chimera("serve", "--config", str(cfg))
    assert proc.returncode == 1
    line = _one_line(proc.stderr)
    assert (
        line
        == f"chimera: error: simulated worker s1: cannot listen on 127.0.0.1:{foreign.port}: address already in use"
    )
    assert "is up" not in proc.stderr and "chimera gateway on" not in proc.stderr


def _backend(port: int) -> BackendConfig:
    cfg = make_config(
        [{"name": "s1", "url": f"http://127.0.0.1:{port}", "model": "m", "sim": {"profile": "h200-qwen2.5-0.5b"}}]
    )
    return cfg.backends[0]


def test_wait_healthy_ignores_a_health_answer_from_another_process() -> None:
    """Should another process take the port between the check and the child's bind: its /health
    does not make the child healthy; the child's exit is reported."""
    with serve_asgi(_health_ok, lifespan="off") as foreign:
        b = _backend(foreign.port)
        alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stderr=subprocess.PIPE)
        try:
            with pytest.raises(ChimeraError, match="another process answers there"):
                _wait_healthy(b, alive, time.monotonic() + 1.0)
        finally:
            alive.kill()
            alive.wait()
            assert alive.stderr is not None
            alive.stderr.close()
        code = "import sys, time; time.sleep(0.5); sys.exit('chimera: error: cannot listen')"
        dying = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
        try:
            with pytest.raises(ChimeraError, match="s1 exited: chimera: error: cannot listen"):
                _wait_healthy(b, dying, time.monotonic() + 20)
        finally:
            dying.wait()
            assert dying.stderr is not None
            dying.stderr.close()


def test_sim_health_names_its_process(sim_server: Any) -> None:
    srv = sim_server()
    assert httpx.get(srv.url + "/health").headers[SIM_PID_HEADER] == str(os.getpid())


# 3. Each `chimera sim` setting's error names its own flag.


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--speedup", "-1"], "--speedup"),
        (["--speedup", "nan"], "--speedup"),
        (["--kv-tokens", "0"], "--kv-tokens"),
        (["--kv-tokens", "4"], "--kv-tokens"),
        (["--seed", "-1"], "--seed"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
        (["--max-model-len", "0"], "--max-model-len"),
        (["--model", ""], "--model"),
        (["--profile", "no-such-profile"], "--profile"),
        (["--also", "port=1,kv_tokens=0"], "--also"),
        (["--also", "port=1,max_model_len=-5"], "--also"),
    ],
)
def test_sim_error_names_its_flag(capsys: pytest.CaptureFixture[str], args: list[str], flag: str) -> None:
    assert main(["sim", "--port", str(free_port()), *args]) == 2
    assert _one_line(capsys.readouterr().err).startswith(f"chimera: error: {flag}: ")


# 4. The config's max_model_len reaches the simulated workers (alone and co-located).


def test_sim_command_carries_max_model_len_to_the_sim_settings() -> None:
    cfg = make_config(
        [
            {"name": "a", "url": "http://127.0.0.1:9101", "model": "m", "max_model_len": 1024, "gpu": 0,
             "sim": {"profile": "h200-qwen2.5-0.5b"}},
            {"name": "b", "url": "http://127.0.0.1:9102", "model": "m", "max_model_len": 2048, "gpu": 0,
             "sim": {"profile": "h200-qwen2.5-0.5b"}},
        ]
    )  # fmt: skip
    cmd = sim_command(*sim_groups(cfg.backends)[0])
    args = _build_parser().parse_args(cmd[3:])  # after `python -m router.cli`
    first, also = sim_workers(args)
    assert first.max_model_len == 1024
    assert [(s.max_model_len, port) for s, _, port in also] == [(2048, 9102)]


@pytest.mark.slow
def test_serve_sims_enforce_the_configs_max_model_len(tmp_path: Path) -> None:
    gw, a, b = free_port(), free_port(), free_port()
    cfg = tmp_path / "len.yaml"
    cfg.write_text(
        f"gateway: {{port: {gw}, policy: round_robin, default_agent: chat}}\n"
        "backends:\n"
        f'  - {{name: a, url: "http://127.0.0.1:{a}", model: m, kv_budget_tokens: 100000, max_model_len: 1024,'
        " gpu: 0, sim: {profile: h200-qwen2.5-0.5b, speedup: 20}}\n"
        f'  - {{name: b, url: "http://127.0.0.1:{b}", model: m, kv_budget_tokens: 100000, max_model_len: 2048,'
        " gpu: 0, sim: {profile: h200-qwen2.5-0.5b, speedup: 20}}\n"
        "agents:\n  - {name: chat, models: [m]}\n"
    )
    proc = subprocess.Popen([sys.executable, "-m", "router.cli", "serve", "--config", str(cfg)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_ready(f"http://127.0.0.1:{gw}/ready", 40, proc=proc)
        for port, limit in ((a, 1024), (b, 2048)):
            url = f"http://127.0.0.1:{port}"
            assert httpx.get(url + "/v1/models").json()["data"][0]["max_model_len"] == limit
            body = {"model": "m", "prompt": "hi", "max_tokens": limit}  # 1 prompt token + limit: one too many
            r = httpx.post(url + "/v1/completions", json=body, timeout=10)
            assert r.status_code == 400
            assert f"maximum context length is {limit} tokens" in r.json()["error"]["message"]
            body["max_tokens"] = 4
            assert httpx.post(url + "/v1/completions", json=body, timeout=10).status_code == 200
    finally:
        interrupt(proc)
        assert proc.stderr is not None
        proc.stderr.close()
