"""The scale-out bench end to end on loopback: a private Redis, zero-latency workers, gateway replicas and
`chimera serve --workers 2`, client processes; the figures it writes are the ones its docs table reads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.quiet  # (it saturates the gateways: beside other tests, a starved one answers Redis past op_timeout_s)
def test_scaling_bench_measures_replicas_and_serve_workers_on_one_redis(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    cmd = [sys.executable, "-m", "chimera_bench.scaling", "--replicas", "1", "--serve-workers", "2", "--workers", "1",
           "--clients", "1", "--connections", "4", "--rates", "100,1000000", "--duration", "1", "--warmup", "0.3",
           "--repeat", "1", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads((tmp_path / "scaling.json").read_text())
    assert [r["setting"] for r in doc["rows"]] == ["replicas x1", "serve --workers 2"]
    for row in doc["rows"]:
        assert row["errors"] == 0 and row["saturation_rps"] > 50 and row["degraded_events"] == 0
        # reserve and release, one script call each, whichever process served (the rest: syncs and probes)
        assert 1.8 <= row["gateway_round_trips_per_request"] <= 3.0, row
        assert row["redis_commands_per_request"] > row["gateway_round_trips_per_request"]  # the scripts' own
        assert [x["rate"] for x in row["rates"]] == [100.0]  # a rate past saturation is not measured
        assert row["rates"][0]["errors"] == 0 and row["rates"][0]["added_ms"]["p50"] is not None
    assert [c["replicas"] for c in doc["redis_ceiling"]] == [1]
    assert all(c["put_scripts_per_s"] > 0 for c in doc["redis_ceiling"])
    assert len(doc["summary"]) == 2
