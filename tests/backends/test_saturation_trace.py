"""scripts/saturation_trace.py against a sim over loopback: the closed burst and the side-by-side comparison."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "saturation_trace.py"


def trace(*args: str) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_burst_past_the_kv_budget_preempts_and_one_within_it_does_not(sim_server, tmp_path: Path) -> None:
    # 48 requests of 64 + 64 tokens need 384 blocks of 16; 2,048 KV tokens hold 128 of them
    for kv, preempts in ((2048, True), (100_000, False)):
        srv = sim_server(model="m", kv_tokens=kv, speedup=20.0)
        out = tmp_path / f"burst-{kv}.json"
        trace("--url", srv.url, "--model", "m", "--burst", "48,64,64", "--pause", "0", "--out", str(out))
        doc = json.loads(out.read_text())
        assert doc["burst"] == {"requests": 48, "prompt": 64, "out": 64}
        for mode in ("nonstream", "stream"):
            run = doc[mode]
            assert run["errors"] == 0 and run["makespan_s"] > 0
            assert run["e2e_ms_p50"] <= run["e2e_ms_p99"] <= run["makespan_s"] * 1000 + 0.1  # rounded to 0.1 ms
            assert (run["preemptions"] > 0) is preempts, (kv, mode, run)


def test_compare_sets_two_sweeps_side_by_side(sim_server, tmp_path: Path) -> None:
    paths = []
    for kv in (8192, 100_000):  # the longest request: 4,000 + 512 tokens
        srv = sim_server(model="m", kv_tokens=kv, speedup=20.0)
        paths.append(str(tmp_path / f"sweep-{kv}.json"))
        trace("--url", srv.url, "--model", "m", "--rates", "30", "--duration", "1", "--drain", "10", "--pause", "0",
              "--out", paths[-1])  # fmt: skip
    table = trace("--compare", *paths).splitlines()
    assert "decode ms/token p50" in table[0] and "KV max" in table[0]
    row = table[1].split(" | ")
    assert row[0] == "30.0" and len(row) == 3
    small, large = (json.loads(Path(p).read_text())["runs"][0]["summary"] for p in paths)
    assert small["kv_max"] > large["kv_max"]
    assert all(cell.endswith("(err 0)") for cell in row[1:])
