"""`chimera workers up` on a machine without a GPU or vLLM.

Real processes, ports and process groups; the only stand-ins are a ``vllm`` package
(``fake_vllm/``: flags, ``/health``, ``/metrics`` with ``vllm:cache_config_info``, vLLM's log lines)
and, for one test, an ``nvidia-smi`` script.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from backends import workers_cli
from backends.launcher import Machine, kv_tokens_from_log, kv_tokens_from_metrics, plan_workers, tool_calling_args
from backends.listen import free_port
from router.cli import _build_parser, main
from router.core.config import load_config
from router.core.errors import ConfigError, LaunchError

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parent / "fake_vllm"
BYTES_0_5B = 12288  # KV bytes per token of the Qwen2.5-0.5B shape: 24 layers x 2 x 2 heads x 64 x bf16


def write_config(tmp: Path, workers: list[dict[str, object]]) -> Path:
    lines = ["gateway: {policy: round_robin}", "backends:"]
    for w in workers:
        launch = w.get("launch", "{hf_model: /models/q, gpu: 0, kv_cache_gib: 1}")
        lines += [f"  - name: {w['name']}", f"    url: http://127.0.0.1:{w['port']}", f"    model: {w['model']}",
                  f"    kv_budget_tokens: {w.get('kv', 87376)}", "    max_model_len: 4096",
                  f"    launch: {launch}"]  # fmt: skip
    models = ", ".join(str(w["model"]) for w in workers)
    lines += ["agents:", "  - name: chat", f"    models: [{models}]"]
    path = tmp / "workers.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """The stand-in vLLM importable by every child, one visible GPU, compile caches under tmp."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vcache"))
    monkeypatch.setenv("FAKE_VLLM_BYTES_PER_TOKEN", str(BYTES_0_5B))
    return dict(os.environ)


def two_workers(tmp: Path, **kv: int) -> Path:
    return write_config(tmp, [
        {"name": "a", "port": free_port(), "model": "qa", "kv": kv.get("a", 87376)},
        {"name": "b", "port": free_port(), "model": "qb", "kv": kv.get("b", 87376)},
    ])  # fmt: skip


def up(cfg: Path, tmp: Path, *extra: str, machine: Machine | None = None) -> tuple[int, str]:
    args = _build_parser().parse_args(["workers", "up", "--config", str(cfg), "--log-dir", str(tmp / "logs"),
                                       "--timeout", "20", *extra])  # fmt: skip
    out = tmp / "out.txt"
    with out.open("w") as f:
        code = workers_cli.run(args, machine=machine, out=f, poll_s=0.05)
    return code, out.read_text()


# -- plans and parsing ---------------------------------------------------------------------------


def test_plan_pins_gpu_fixes_kv_and_shares_memory(tmp_path: Path) -> None:
    cfg = load_config(write_config(tmp_path, [
        {"name": "a", "port": 8001, "model": "qa", "launch": "{hf_model: Qwen/A, gpu: 1, kv_cache_gib: 16}"},
        {"name": "b", "port": 8002, "model": "qb",
         "launch": "{hf_model: /m/b, gpu: 1, kv_cache_gib: 0.5, extra_args: [--load-format, dummy]}"},
        {"name": "c", "port": 8003, "model": "qc", "launch": "{hf_model: /m/c, gpu: 0, kv_cache_gib: 2}"},
    ]))  # fmt: skip
    plans = plan_workers(
        cfg, python="py", log_dir=tmp_path, env={"CUDA_VISIBLE_DEVICES": "4,6", "VLLM_CACHE_ROOT": "/c"}
    )
    a, b, c = plans
    assert a.argv[:3] == ("py", "-m", "vllm.entrypoints.openai.api_server")
    assert a.argv[3:] == ("--model", "Qwen/A", "--served-model-name", "qa", "--host", "127.0.0.1", "--port", "8001",
                          "--max-model-len", "4096", "--kv-cache-memory-bytes", str(16 * 1024**3),
                          "--gpu-memory-utilization", "0.45",
                          "--enable-auto-tool-choice", "--tool-call-parser", "hermes")  # fmt: skip
    assert b.argv[-2:] == ("--load-format", "dummy") and str(512 * 1024**2) in b.argv
    assert "--gpu-memory-utilization" not in c.argv  # alone on its GPU: vLLM's default
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["6", "6", "4"]  # index into the visible list
    assert a.env["VLLM_CACHE_ROOT"] == "/c/chimera-a" and a.log_path == tmp_path / "a.log"
    assert a.shell().startswith("CUDA_VISIBLE_DEVICES=6 VLLM_CACHE_ROOT=/c/chimera-a py -m vllm.")


def test_tool_calling_is_on_with_the_model_family_s_parser() -> None:
    """Agent frameworks send tool_choice: auto, which vLLM refuses without a tool-call parser."""
    on = ["--enable-auto-tool-choice", "--tool-call-parser"]
    assert tool_calling_args("Qwen/Qwen2.5-7B-Instruct", ()) == [*on, "hermes"]
    assert tool_calling_args("meta-llama/Llama-3.1-8B-Instruct", ()) == [*on, "llama3_json"]
    assert tool_calling_args("mistralai/Mistral-7B-Instruct-v0.3", ()) == [*on, "mistral"]
    assert tool_calling_args("/models/q", ()) == []  # a family it does not know: none (extra_args can say)
    assert tool_calling_args("Qwen/Qwen2.5-7B", ("--tool-call-parser", "pythonic")) == []  # the config's own


def test_a_backend_api_key_reaches_vllm_through_its_env_not_its_command_line(tmp_path: Path) -> None:
    path = write_config(tmp_path, [{"name": "a", "port": 8001, "model": "qa"}])
    keyed = path.read_text().replace("    max_model_len: 4096\n", "    max_model_len: 4096\n    api_key: wk-1\n")
    path.write_text(keyed)
    (plan,) = plan_workers(load_config(path), python="py", log_dir=tmp_path, env={})
    assert plan.env["VLLM_API_KEY"] == "wk-1" and "wk-1" not in " ".join(plan.argv)
    assert "VLLM_API_KEY=***" in plan.shell() and "wk-1" not in plan.shell()


def test_kv_capacity_parsers() -> None:
    metrics = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
               'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="18724",'
               'num_gpu_blocks_override="None"} 1.0\n')  # fmt: skip
    assert kv_tokens_from_metrics(metrics) == 299_584
    assert kv_tokens_from_metrics("vllm:num_requests_running 0\n") is None
    log = "INFO 11-29 [kv_cache_utils.py:1] GPU KV cache size: 1,398,096 tokens\n"
    assert kv_tokens_from_log(log) == 1_398_096 and kv_tokens_from_log("nothing") is None


def test_dry_run_prints_commands_and_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = two_workers(tmp_path)
    assert main(["workers", "up", "--config", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("-m vllm.entrypoints.openai.api_server") == 2 and "CUDA_VISIBLE_DEVICES=0" in out
    assert "--kv-cache-memory-bytes 1073741824" in out and "--served-model-name qb" in out


def test_no_launch_backend_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("backends:\n  - {name: a, url: 'http://127.0.0.1:9', model: m, kv_budget_tokens: 10}\n"
                   "agents:\n  - {name: x, models: [m]}\n")  # fmt: skip
    assert main(["workers", "up", "--config", str(cfg), "--dry-run"]) == 2
    assert "nothing to start" in capsys.readouterr().err


# -- refusals before anything starts -------------------------------------------------------------


def test_vllm_missing_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # no stand-in: this venv has no vLLM
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert main(["workers", "up", "--config", str(two_workers(tmp_path))]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vLLM is not installed" in err and "Traceback" not in err


def test_no_gpu(tmp_path: Path, fake_env: dict[str, str]) -> None:
    no_smi = {k: v for k, v in fake_env.items() if k != "CUDA_VISIBLE_DEVICES"} | {"PATH": str(tmp_path)}
    for env in ({**fake_env, "CUDA_VISIBLE_DEVICES": ""}, {**fake_env, "CUDA_VISIBLE_DEVICES": "-1"}, no_smi):
        with pytest.raises(LaunchError, match="no GPU"):
            up(two_workers(tmp_path), tmp_path, machine=Machine(env=env))


def test_gpu_index_out_of_range_via_nvidia_smi(tmp_path: Path, fake_env: dict[str, str]) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0\\n1\\n'\n")
    smi.chmod(0o755)
    env = {k: v for k, v in fake_env.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    assert Machine(env=env).gpus() == ["0", "1"]
    cfg = write_config(tmp_path, [{"name": "a", "port": free_port(), "model": "qa",
                                   "launch": "{hf_model: m, gpu: 2, kv_cache_gib: 1}"}])  # fmt: skip
    with pytest.raises(ConfigError, match=r"launch.gpu: GPU 2 is out of range: this machine has 2"):
        up(cfg, tmp_path, machine=Machine(env=env))


def test_port_taken(tmp_path: Path, fake_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = write_config(tmp_path, [{"name": "a", "port": port, "model": "qa"}])
        assert main(["workers", "up", "--config", str(cfg), "--log-dir", str(tmp_path)]) == 1
    assert f"worker a: port {port} on 127.0.0.1 is taken" in capsys.readouterr().err
    assert not (tmp_path / "a.log").exists()  # refused before anything started


# -- start-up failures: the others are stopped, one line says why ----------------------------------


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_oom_at_start_stops_the_others(
    tmp_path: Path, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_MODES", "qb=oom")
    cfg = two_workers(tmp_path)
    with pytest.raises(LaunchError, match=r"worker b: out of GPU memory at start .*CUDA out of memory"):
        up(cfg, tmp_path)
    assert _port_closed(load_config(cfg).backends[0].port)


def test_early_exit_shows_last_log_line(
    tmp_path: Path, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_MODES", "qa=exit")
    with pytest.raises(LaunchError, match=r"worker a exited with code 3 .*: ValueError: the model's max seq len"):
        up(two_workers(tmp_path), tmp_path)


def test_health_timeout(tmp_path: Path, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_VLLM_MODES", "qa=hang")
    cfg = write_config(tmp_path, [{"name": "a", "port": free_port(), "model": "qa"}])
    with pytest.raises(LaunchError, match=r"worker a not healthy at .* after 1 s; last log line: INFO Starting"):
        up(cfg, tmp_path, "--timeout", "1")


# -- the whole command, as a user runs it ----------------------------------------------------------


def test_up_checks_kv_and_stops_all_on_sigterm(tmp_path: Path, fake_env: dict[str, str]) -> None:
    cfg = two_workers(tmp_path, b=90000)  # a: as vLLM allocates (1 GiB / 12288 B, whole blocks); b: wrong
    proc = subprocess.Popen([sys.executable, "-m", "router.cli", "workers", "up", "--config", str(cfg),
                             "--log-dir", str(tmp_path / "logs"), "--timeout", "20"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lines.append(proc.stdout.readline())
        if "workers healthy" in lines[-1] or not lines[-1]:
            break
    assert "all 2 workers healthy (1 KV mismatch(es))" in lines[-1], lines
    assert any("worker a: KV capacity 87,376 tokens, as configured" in ln for ln in lines)
    ports = [b.port for b in load_config(cfg).backends]
    assert all(httpx.get(f"http://127.0.0.1:{p}/health").status_code == 200 for p in ports)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "stopping workers" in out
    assert "set kv_budget_tokens: 87376" in err and "Traceback" not in err
    assert all(_port_closed(p) for p in ports)
    assert "GPU KV cache size" in (tmp_path / "logs" / "b.log").read_text()
