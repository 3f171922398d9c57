"""`chimera profile` against a live simulated worker recovers the profile the worker runs: real processes, a
small grid. The profile written loads where a config and `chimera sim` name it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backends.listen import free_port, wait_ready
from predictor.prior import WorkerProfile, prior_latency
from router.core.profile import Profile, load_profile
from router.core.types import BackendView
from tests.conftest import interrupt

ROOT = Path(__file__).resolve().parents[2]
TRUTH = "h200-qwen2.5-7b"
# The sim runs at half speed: on a machine of two cores the sim, the probe's client and the sim's own HTTP cost
# (wall time, so a speedup multiplies it in the worker's seconds) stay small beside the steps measured.
SPEEDUP = 0.5
GRID = ["--ttft-prompts", "32,128,512,1024,2048,4096,8192", "--ttft-reps", "3", "--tpot-prompts", "256",
        "--batches", "1,8,32,256", "--tpot-out", "32", "--mix-out", "300", "--burst", "32"]  # fmt: skip


def _chimera(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "router.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@contextlib.contextmanager
def _sim(*args: str) -> Iterator[str]:
    """A `chimera sim` process; its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "router.cli", "sim", "--port", str(port), *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", 30, proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        interrupt(proc)


@pytest.fixture
def sim_worker() -> Iterator[str]:
    with _sim("--profile", TRUTH, "--speedup", str(SPEEDUP)) as url:
        yield url


def _ttft(p: Profile, prompt: int) -> float:
    """A lone prompt's TTFT, as the gateway's analytic prior predicts it from ``p``."""
    return prior_latency(WorkerProfile.of(p), BackendView(name="w", model="m"), prompt, 0.0)[0]


def _tpot(p: Profile, batch: int, ctx: float) -> float:
    """A decode step of ``batch`` sequences of ``ctx`` tokens each, as the prior predicts it: one request joining
    ``batch - 1`` running ones (whose context it takes as half their reservation)."""
    n = batch - 1
    view = BackendView(name="w", model="m", running=n, waiting=0, inflight_requests=n,
                       inflight_tokens=round(2 * ctx * n))  # fmt: skip
    return prior_latency(WorkerProfile.of(p), view, round(2 * ctx), 0.0)[1]


@pytest.mark.slow
@pytest.mark.quiet
def test_profile_recovers_a_simulated_workers_ttft_and_tpot(sim_worker: str, tmp_path: Path) -> None:
    out = tmp_path / "my-7b.json"
    proc = _chimera("profile", "--url", sim_worker, "--model", "qwen2.5-7b", "--speedup", str(SPEEDUP),
                    "--out", str(out), "--quality", "0.78", "--procs", "2", *GRID)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {out}" in proc.stdout
    fitted, truth = load_profile(str(out)), load_profile(TRUTH)
    assert fitted.kv_budget_tokens == truth.kv_budget_tokens  # read off the worker's /metrics
    assert fitted.max_model_len == truth.max_model_len  # and its /v1/models
    data = json.loads(out.read_text())
    prov, (probe,) = data["provenance"], data["raw"]["probes"]
    assert prov["servers"][0]["url"] == sim_worker and prov["servers"][0]["version"] == "0.26.0+sim"
    assert prov["date"] and prov["fit"]["points"] > 10 and probe["meta"]["model"] == "qwen2.5-7b"
    errors = {f"ttft p{t['prompt']}": _ttft(fitted, t["prompt"]) / _ttft(truth, t["prompt"]) - 1 for t in probe["ttft"]}
    for t in probe["tpot"]:
        b, ctx = t["batch"], t["steady"]["ctx_mid"]
        errors[f"tpot b{b}"] = _tpot(fitted, b, ctx) / _tpot(truth, b, ctx) - 1
    assert len(errors) == 7 + 4
    assert {k: round(e, 3) for k, e in errors.items() if abs(e) > 0.10} == {}

    # the profile loads where a config names it, and as a sim's
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"gateway: {{policy: predictive}}\nbackends:\n  - {{name: w, url: '{sim_worker}', "
                   f"model: qwen2.5-7b, kv_budget_tokens: 299584, profile: {out}}}\n"
                   "agents:\n  - {name: a, models: [qwen2.5-7b]}\n")  # fmt: skip
    check = _chimera("check", str(cfg))
    assert check.returncode == 0 and f"profile={out}" in check.stdout and check.stderr == "", check.stderr
    with _sim("--profile", str(out)) as url:
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "qwen2.5-7b"
