"""`chimera profile`'s bad inputs: each is one line on stderr, exit 2 for the user's arguments and files, 1 for a
worker that cannot be reached or answers errors; never a traceback."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from backends.listen import free_port
from router.cli import main
from tests.conftest import ServerThread, serve_asgi

ROOT = Path(__file__).resolve().parents[2]


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _profile(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["profile", *args])
    return code, _one_line(capsys.readouterr().err)


def test_an_unreachable_worker_is_one_line_exit_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.run([sys.executable, "-m", "router.cli", "profile", "--url", url, "--model", "m"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1
    assert _one_line(proc.stderr).startswith(f"chimera: error: cannot reach the worker: GET {url}/v1/models: ")


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["--url", "http://x:1", "--fit", "p.json", "--model", "m"], "not allowed with argument"),
        (["--url", "http://x:1"], "--model"),
        (["--url", "http://x:1", "--model", "m", "--batches", "1,x"], "--batches"),
        (["--url", "http://x:1", "--model", "m", "--phases", "ttft,kv"], "--phases: unknown phase(s) kv"),
        (["--url", "http://x:1", "--model", "m", "--mix-at", "0.5"], "--mix-at: needs one time"),
        (["--url", "http://x:1", "--model", "m", "--speedup", "0"], "--speedup: must be positive"),
        (["--fit", "p.json", "--model", "m", "--quality", "2"], "--quality: must be in [0, 1]"),
        (["--fit", "nowhere.json", "--model", "m"], "nowhere.json: --fit: cannot read"),
        (["--fit", "p.json", "--model", "m", "--against", "no-such"], "--against: unknown profile 'no-such'"),
        (["--fit", "p.json", "--model", "m", "--speedup", "2"], "--speedup: is a flag of the probe"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(
    args: list[str], where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.json").write_text(json.dumps({"ttft": []}))
    with pytest.raises(SystemExit) as exc:  # argparse's own errors exit from inside main
        raise SystemExit(main(["profile", *args]))
    assert exc.value.code == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("chimera: error: ") and where in line, line


def test_a_file_that_holds_no_probe_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "colocate.json"
    bad.write_text(json.dumps({"prompt": 256, "phases": []}))
    code, line = _profile(capsys, "--fit", str(bad), "--model", "m")
    assert code == 2
    assert line == f"chimera: error: {bad}: --fit: neither a probe's results nor a profile holding them (raw.probes)"


def _fake_worker(models: Callable[[Any], Any], metrics: str = "") -> Starlette:
    async def v1_models(request: Any) -> Any:
        return models(request)

    async def prom(request: Any) -> Any:
        return PlainTextResponse(metrics)

    return Starlette(routes=[Route("/v1/models", v1_models), Route("/metrics", prom)])


def test_a_worker_answering_errors_is_one_line_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    app = _fake_worker(lambda _: JSONResponse({"error": "down for maintenance"}, status_code=503))
    with serve_asgi(app) as srv:
        code, line = _profile(capsys, "--url", srv.url, "--model", "m")
    assert code == 1 and line.startswith(f"chimera: error: GET {srv.url}/v1/models answered HTTP 503: "), line


def test_a_model_not_served_and_an_unknown_kv_capacity_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    app = _fake_worker(lambda _: JSONResponse({"object": "list", "data": [{"id": "served", "max_model_len": 4096}]}))
    with serve_asgi(app) as srv:
        code, line = _profile(capsys, "--url", srv.url, "--model", "other")
        assert code == 2 and line == f"chimera: error: --model: the worker at {srv.url} serves served, not 'other'"
        code, line = _profile(capsys, "--url", srv.url, "--model", "served")
    assert code == 2 and line.startswith(f"chimera: error: --kv-tokens: the worker at {srv.url} does not say its KV")


def test_a_worker_failing_every_request_is_one_line_exit_1(
    sim_server: Callable[..., ServerThread], capsys: pytest.CaptureFixture[str]
) -> None:
    srv = sim_server(model="m", max_model_len=16)  # the warm-up's first request (32 + 8 tokens) does not fit
    code = main(["profile", "--url", srv.url, "--model", "m", "--procs", "1", "--max-model-len", "8192"])
    progress, error = capsys.readouterr().err.strip().splitlines()  # what it probes, then why it stopped
    assert code == 1 and progress.startswith(f"chimera profile: probing m at {srv.url} (version 0.26.0+sim")
    assert error.startswith(f"chimera: error: the worker at {srv.url} failed every request of a batch of 1: HTTP 400: ")
    assert "maximum context length is 16 tokens" in error


def test_an_out_that_is_not_a_regular_file_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The profile is written to a temporary file renamed over --out: a device there (/dev/null, run as root) would
    be replaced, so it is refused first. (A named pipe stands for the device here.)"""
    probe = ROOT / "docs" / "results" / "real-h200" / "probes" / "profile-qwen2.5-1.5b-boot1.json"
    pipe = tmp_path / "out.json"
    os.mkfifo(pipe)
    code, line = _profile(capsys, "--fit", str(probe), "--model", "qwen2.5-1.5b", "--out", str(pipe))
    assert code == 2 and line == f"chimera: error: --out: {pipe} is not a regular file: give a file's path", line
    assert stat.S_ISFIFO(pipe.stat().st_mode) and sorted(tmp_path.iterdir()) == [pipe]
