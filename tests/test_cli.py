"""The `chimera` command line as a user runs it: real processes, real ports, the openai SDK."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.listen import free_port, wait_ready
from backends.sim.api import PID_HEADER
from router.core.errors import ChimeraError
from tests.conftest import interrupt
from tests.redisutil import SHARED_URL, redis_prefix

__all__ = ["redis_prefix"]  # fixtures

ROOT = Path(__file__).resolve().parents[1]


def _chimera(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "router.cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_check_quickstart_prints_the_fleet() -> None:
    proc = _chimera("check", "examples/quickstart.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "small-0" in proc.stdout and "qwen2.5-7b" in proc.stdout and "planner" in proc.stdout


def test_check_shows_what_sets_configs_apart_and_hides_secrets(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "gateway: {policy: predictive, state: 'redis://:s3cret@127.0.0.1:6379/0', predictor: {model: nope.pkl},\n"
        "          policy_options: {wrong_answer_s: 6}, admission: {}}\n"
        "backends:\n  - {name: a, url: 'http://u:pw9@127.0.0.1:9', model: m, kv_budget_tokens: 10, api_key: wk-77,\n"
        "     sim: {profile: h200-qwen2.5-0.5b, seed: 4, max_num_seqs: 8}}\n"
        "agents:\n  - {name: x, models: [m], on_overload: reject}\n"
    )
    proc = _chimera("check", str(cfg))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "s3cret" not in out and "pw9" not in out and "wk-77" not in out  # secrets stay secret
    assert "redis://:***@127.0.0.1:6379/0" in out and "http://u:***@127.0.0.1:9" in out and "api_key=***" in out
    assert "predictor=nope.pkl (not found here)" in out and "policy_options[wrong_answer_s=6.0]" in out
    assert "admission=on" in out and "on_overload=reject" in out and "seed=4,max_num_seqs=8" in out


@pytest.mark.parametrize(
    ("yaml_text", "where"),
    [
        ("gateway: {port: 1}\nbackends: []\nagents: []\n", ":2: backends"),  # empty lists
        (
            "backends:\n  - {name: a, url: 'http://127.0.0.1:1', model: m, kv_budget_tokens: 1, colour: red}\n"
            "agents:\n  - {name: x, models: [m]}\n",
            ":2: backends[a].colour: unknown key",
        ),
        (
            "backends:\n  - name: a\n    url: ftp://nowhere\n    model: m\n    kv_budget_tokens: 5\n"
            "agents:\n  - {name: x, models: [m]}\n",
            ":3: backends[a].url",
        ),
        ("backends: [\n", ":2:"),
        (
            "backends:\n  - {name: a, url: 'http://127.0.0.1:1', model: m, kv_budget_tokens: 1,\n"
            "     scheduling_policy: lifo}\n"
            "agents:\n  - {name: x, models: [m]}\n",
            ":3: backends[a].scheduling_policy",
        ),
    ],
)
def test_check_bad_config_is_one_line_with_file_line_key(tmp_path: Path, yaml_text: str, where: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml_text)
    proc = _chimera("check", str(f))
    assert proc.returncode == 2
    assert proc.stdout == ""
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"chimera: error: {f}") and where in line, line


def test_check_missing_env_var_names_the_variable(tmp_path: Path) -> None:
    f = tmp_path / "keys.yaml"
    f.write_text(
        "backends:\n  - {name: a, url: 'http://127.0.0.1:1', model: m, kv_budget_tokens: 5}\n"
        "agents:\n  - name: x\n    api_keys: [${CHIMERA_TEST_UNSET_KEY}]\n    models: [m]\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CHIMERA_TEST_UNSET_KEY"}
    proc = subprocess.run(
        [sys.executable, "-m", "router.cli", "check", str(f)], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert proc.returncode == 2
    assert ":5:" in proc.stderr and "CHIMERA_TEST_UNSET_KEY is not set" in proc.stderr


def test_bad_arguments_exit_2() -> None:
    assert _chimera("serve").returncode == 2
    assert _chimera("sim", "--port", "notaport").returncode == 2
    proc = _chimera("sim", "--port", str(free_port()), "--profile", "no-such-profile")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


@pytest.fixture
def served_gateway(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str], list[int]]]:
    gw, s1, s2 = free_port(), free_port(), free_port()
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        f"""
gateway: {{port: {gw}, policy: round_robin, default_agent: chat, request_log: {tmp_path}/req.jsonl}}
backends:
  - {{name: s1, url: "http://127.0.0.1:{s1}", model: qwen2.5-0.5b, kv_budget_tokens: 200000,
     sim: {{profile: h200-qwen2.5-0.5b, speedup: 5}}}}
  - {{name: s2, url: "http://127.0.0.1:{s2}", model: qwen2.5-7b, kv_budget_tokens: 200000,
     sim: {{profile: h200-qwen2.5-7b, speedup: 5}}}}
agents:
  - {{name: chat, models: [qwen2.5-0.5b, qwen2.5-7b]}}
"""
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "serve", "--config", str(cfg)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{gw}"
    try:
        wait_ready(base + "/ready", 40, proc=proc)
    except ChimeraError as exc:
        proc.kill()
        pytest.fail(f"{exc}: {proc.communicate()[0]}")
    try:
        yield base, proc, [s1, s2]
    finally:
        if proc.poll() is None:
            interrupt(proc)
        if proc.stdout:
            proc.stdout.close()


@pytest.mark.slow
def test_serve_starts_sims_and_routes(served_gateway: tuple[str, subprocess.Popen[str], list[int]]) -> None:
    base, proc, sim_ports = served_gateway
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    seen = set()
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "hello there"}], max_tokens=8
        )
        seen.add(raw.headers["x-chimera-backend"])
        assert raw.parse().usage is not None
    assert seen == {"s1", "s2"}  # round robin over the two simulated workers
    fleet = httpx.get(base + "/fleet").json()
    assert {b["name"] for b in fleet["backends"]} == {"s1", "s2"}
    # Stopping the gateway stops the simulated workers it started.
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=15)
    assert proc.returncode == 0
    for port in sim_ports:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)


def _two_process_config(path: Path, worker: int, gw: int, gateway_extra: str = "") -> Path:
    """A `--workers 2` config: one zero-latency worker on port ``worker``, the gateway on ``gw``."""
    path.write_text(
        f"gateway: {{port: {gw}, policy: round_robin, default_agent: chat{gateway_extra}}}\n"
        f'backends:\n  - {{name: w, url: "http://127.0.0.1:{worker}", model: m, kv_budget_tokens: 100000}}\n'
        "agents:\n  - {name: chat, models: [m]}\n"
    )
    return path


def _fast_worker(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "chimera_bench.fastworker", "--port", str(port), "--model", "m"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def _scraped_totals(gw: int, name: str, scrapes: int = 8) -> list[float]:
    """``name``'s total over its samples in each of ``scrapes`` scrapes of /metrics, a connection each."""
    totals = []
    for _ in range(scrapes):
        text = httpx.get(f"http://127.0.0.1:{gw}/metrics", timeout=5).text
        totals.append(sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name))
    return totals


@pytest.mark.slow
def test_serve_with_two_processes_audits_and_counts_every_request(tmp_path: Path) -> None:
    """`--workers 2`: each gateway process is spawned afresh and must set up its own logging, or its
    audit lines are dropped (its root logger stays at WARNING); and /metrics counts both processes'
    requests whichever one answers it (else a counter would jump back and forth between scrapes)."""
    worker, gw = free_port(), free_port()
    fast = _fast_worker(worker)
    cfg = _two_process_config(tmp_path / "two.yaml", worker, gw)
    proc = subprocess.Popen([sys.executable, "-m", "router.cli", "serve", "--config", str(cfg), "--workers", "2"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw}/v1", api_key="unused", max_retries=0)
        wait_ready(f"http://127.0.0.1:{gw}/health", 40, proc=proc)
        for _ in range(6):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for _ in range(12):  # a connection each: the kernel spreads them over both processes
            assert httpx.post(f"http://127.0.0.1:{gw}/v1/chat/completions", json=body, timeout=10).status_code == 200
        # /metrics from whichever process a scrape reaches: the sum over both, never one process's share
        totals = set(_scraped_totals(gw, "chimera_requests_total"))
        assert totals == {18.0}, totals
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
        fast.terminate()
        fast.wait(timeout=10)
    audits = [line for line in out.splitlines() if "chimera.audit" in line]
    assert len(audits) == 18, out[-2000:]


@pytest.mark.slow
def test_serve_with_two_processes_on_redis_counts_both_round_trips(tmp_path: Path, redis_prefix: str) -> None:
    """`--workers 2` on a Redis state: each process publishes its Redis round trips on its own, so a scrape of
    either sums both (two per request: reserve and release; syncs and probes are made rare here)."""
    worker, gw = free_port(), free_port()
    fast = _fast_worker(worker)
    state = f"{SHARED_URL}?prefix={redis_prefix}&sync_interval_s=30&lease_ttl_s=60"
    cfg = _two_process_config(tmp_path / "two-redis.yaml", worker, gw,
                              f', state: "{state}", health: {{probe_interval_s: 30}}')  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "router.cli", "serve", "--config", str(cfg), "--workers", "2"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_ready(f"http://127.0.0.1:{gw}/health", 40, proc=proc)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for _ in range(20):  # a connection each: the kernel spreads them over both processes
            assert httpx.post(f"http://127.0.0.1:{gw}/v1/chat/completions", json=body, timeout=10).status_code == 200
        time.sleep(2.5)  # each process publishes its counters every second
        totals = _scraped_totals(gw, "chimera_state_redis_commands_total")
        # 40 PUTs, plus each process's start-up sync and its first probe's election and publication
        assert all(40 <= t <= 40 + 2 * 8 for t in totals), totals
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        fast.terminate()
        fast.wait(timeout=10)


@pytest.mark.slow
def test_serve_restarts_a_killed_sim_and_leaves_none_at_shutdown(tmp_path: Path) -> None:
    """A simulated worker killed under `chimera serve` is reaped and started again on its port; the gateway's
    prober re-admits it and serves through it. Ctrl-C (the terminal's SIGINT to the whole process group)
    stops the gateway, then its workers: no restart on the way out, no process left."""
    gw, sim = free_port(), free_port()
    cfg = tmp_path / "restart.yaml"
    cfg.write_text(
        f"gateway: {{port: {gw}, policy: round_robin, default_agent: chat, health: {{probe_interval_s: 0.2}}}}\n"
        f'backends:\n  - {{name: s1, url: "http://127.0.0.1:{sim}", model: qwen2.5-0.5b, kv_budget_tokens: 200000,\n'
        "     sim: {profile: h200-qwen2.5-0.5b, speedup: 5}}\n"
        "agents:\n  - {name: chat, models: [qwen2.5-0.5b]}\n"
    )
    cmd = [sys.executable, "-m", "router.cli", "serve", "--config", str(cfg)]
    # its own process group, as a terminal's foreground job: Ctrl-C signals the whole group
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    base, sim_url = f"http://127.0.0.1:{gw}", f"http://127.0.0.1:{sim}"
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)

    def sim_pid() -> str | None:
        try:
            return httpx.get(sim_url + "/health", timeout=0.5).headers.get(PID_HEADER)
        except httpx.HTTPError:
            return None

    def served() -> bool:
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        except openai.APIError:
            return False
        return raw.headers["x-chimera-backend"] == "s1"

    try:
        wait_ready(base + "/ready", 40, proc=proc)
        first = sim_pid()
        assert first is not None and served()
        os.kill(int(first), signal.SIGKILL)
        killed = time.monotonic()
        while sim_pid() in (None, first):
            assert time.monotonic() - killed < 5, "the killed sim did not come back"
            time.sleep(0.02)
        back_s = time.monotonic() - killed
        while not served():
            assert time.monotonic() - killed < 8, "the gateway did not serve through the restarted sim"
            time.sleep(0.05)
        assert not Path(f"/proc/{first}").exists()  # reaped, not a zombie
        second = sim_pid()
        assert second is not None and second != first
    finally:
        client.close()
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out[-2000:]
    assert 0.5 <= back_s < 5
    exits = [line for line in out.splitlines() if "exited (" in line]
    assert len(exits) == 1 and exits[0].endswith("simulated worker s1 exited (status -9, SIGKILL); restarting in 0.5 s")
    assert not Path(f"/proc/{second}").exists()
    with pytest.raises(httpx.ConnectError):
        httpx.get(sim_url + "/health", timeout=1)
