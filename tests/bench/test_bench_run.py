"""End to end: `chimera bench` runs real sims and gateways on loopback and writes the contract's files."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from chimera_bench import client as bc
from chimera_bench.overhead import offer, run_overhead, saturation
from chimera_bench.runner import BenchSpec, run_bench
from tests.redisutil import redis_prefix

__all__ = ["redis_prefix"]  # a fixture

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = {"policy", "requests", "errors", "throughput_rps", "output_tok_per_s", "ttft_ms", "e2e_ms",
            "workflow_e2e_ms", "sla_attainment", "goodput_rps", "task_success", "config"}  # fmt: skip
QUANTILES = {"p50", "p90", "p99", "mean"}


def test_tiny_bench_writes_results_and_plots(tmp_path: Path) -> None:
    spec = BenchSpec(
        config_path=str(ROOT / "examples" / "quickstart.yaml"), workload="mixed",
        policies=("round_robin", "least_outstanding"), rates=(6.0,), users=None, duration_s=1.0, warmup_s=0.2,
        seeds=(1,), out=str(tmp_path), speedup=25.0, drain_s=15.0,
    )  # fmt: skip
    run_bench(spec)
    entries = json.loads((tmp_path / "results.json").read_text())
    assert [e["policy"] for e in entries] == ["round_robin", "least_outstanding"]
    for e in entries:
        assert CONTRACT | {"task_success_strict"} <= set(e)
        for key in ("ttft_ms", "e2e_ms", "workflow_e2e_ms"):
            assert set(e[key]) == QUANTILES
        assert e["requests"] > 0 and e["errors"] == 0
        assert 0.0 <= e["sla_attainment"] <= 1.0 and 0.0 <= e["task_success"] <= 1.0
        assert e["ttft_ms"]["p50"] <= e["e2e_ms"]["p50"]
        assert e["config"]["speedup"] == 25.0 and e["config"]["workload"] == "mixed"
        assert set(e["peak_kv_usage"]) == {"small-0", "large-0"}
        assert e["prefix_cache_hit_rate"] is not None and e["prefix_cache_hit_rate"] > 0  # contexts grow
        assert e["worker_counters_since"] == "run"
    for png in ("latency_cdf.png", "sla_vs_rate.png", "frontier.png"):
        assert (tmp_path / png).stat().st_size > 1000
    assert list((tmp_path / "logs").glob("requests-*.jsonl"))  # the gateway's request logs, for the predictor


def test_overhead_workload_fields(tmp_path: Path) -> None:
    entries = run_overhead(rates=(100.0,), duration_s=0.7, warmup_s=0.1, out=str(tmp_path), pin=False)
    (e,) = entries
    assert CONTRACT <= set(e) and e["workload"] == "overhead"
    assert set(e["added_latency_ms"]) == {"p50", "p99"}
    assert e["direct_rps"] > 50 and e["gateway_rps"] > 50 and 0.5 < e["throughput_ratio"] < 1.5
    assert e["errors"] == 0 and e["added_latency_ms"]["p50"] is not None
    assert json.loads((tmp_path / "results.json").read_text()) == entries
    assert "tottime" in (tmp_path / "gateway-profile.txt").read_text()


def test_overhead_runs_the_floor_and_chimera_as_replicas_and_finds_where_each_saturates(tmp_path: Path) -> None:
    """``floor`` (uvicorn + aiohttp, nothing of chimera's) and chimera as two processes on one port each relay
    every request; saturation.json names, per router and stream setting, the highest rate each held."""
    ROUTERS = ("round_robin x2", "floor")
    entries = run_overhead(rates=(40.0, 80.0), duration_s=0.6, warmup_s=0.1, out=str(tmp_path), pin=False,
                           peers=("floor",), streams=(True, False), replicas=2)  # fmt: skip
    assert [(e["policy"], e["stream"], e["rate"]) for e in entries] == [
        (name, stream, rate) for rate in (40.0, 80.0) for stream in (True, False) for name in ROUTERS
    ]  # fmt: skip
    for e in entries:
        assert e["errors"] == 0 and e["requests"] > 10 and 0.8 < e["throughput_ratio"] < 1.2, e
        assert e["cpu_us_per_request"] is None if sys.platform != "linux" else e["cpu_us_per_request"] > 0, e
    held = json.loads((tmp_path / "saturation.json").read_text())
    assert {(h["policy"], h["stream"]) for h in held} == {(n, s) for n in ROUTERS for s in (True, False)}
    for h in held:  # (so short a run may miss the 1 % throughput rule by one late answer: see the next test)
        assert {h["held_rps"], h["failed_rps"]} <= {40.0, 80.0, None} and h["held_rps"] != h["failed_rps"], h


def test_saturation_is_the_highest_rate_held_with_a_short_tail() -> None:
    def run(rate: float, ratio: float, p99: float, errors: int = 0) -> dict[str, Any]:
        return {"policy": "r", "stream": True, "rate": rate, "throughput_ratio": ratio, "errors": errors,
                "e2e_ms": {"p99": p99}}  # fmt: skip

    runs = [run(1000, 1.0, 3.0), run(2000, 1.0, 49.0), run(3000, 1.0, 51.0), run(4000, 0.9, 900.0)]
    assert saturation(runs) == [{"policy": "r", "stream": True, "held_rps": 2000, "failed_rps": 3000,
                                 "p99_limit_ms": 50.0}]  # fmt: skip
    (only,) = saturation([run(1000, 0.98, 3.0), run(2000, 1.0, 3.0, errors=1)])
    assert only["held_rps"] is None and only["failed_rps"] == 1000


async def test_overhead_client_resends_on_a_connection_the_server_closed_while_idle() -> None:
    """A server that closes every connection after one answer (as uvicorn does an idle keep-alive one
    after 5 s): each reuse finds it closed before any answer, so the request goes again on a new
    connection and counts as a reconnect, not an error. A server that breaks off mid-answer is an error."""
    served = [0]

    async def one_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cut: bool) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")).split(b":")[1])
        await reader.readexactly(length)
        served[0] += 1
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n" + (b"" if cut else b"ok"))  # cut: no body
        await writer.drain()
        writer.close()

    for cut in (False, True):
        server = await asyncio.start_server(lambda r, w, cut=cut: one_answer(r, w, cut), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            got = await offer(f"http://127.0.0.1:{port}", rate=40.0, duration_s=0.5, warmup_s=0.0, seed=1)
        if not cut:
            assert got["errors"] == 0 and got["requests"] == served[0] > 5  # each served once
            assert got["reconnects"] > 0
        else:
            assert got["errors"] == got["requests"] > 5 and got["reconnects"] == 0
            assert all(k.startswith("IncompleteReadError") for k in got["error_kinds"])


async def test_worker_counters_are_each_runs_own(sim_server: Callable[..., Any]) -> None:
    """vLLM's counters run from the worker's start; a bench run reports what it added (a real worker
    serves many runs: summed since boot, real vLLM's prefix hit rates would be off by half)."""
    srv = sim_server(model="m")
    workers = {"w": srv.url}
    prompt = [{"role": "user", "content": "alpha beta gamma delta " * 40}]
    async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x") as client:
        for _ in range(2):  # an earlier run: one miss, one hit
            await client.chat.completions.create(model="m", messages=prompt, max_tokens=2)
        before = await bc.scrape_workers(workers)
        await client.chat.completions.create(model="m", messages=prompt, max_tokens=2)  # this run: one hit
        since = bc.counters_since(before, await bc.scrape_workers(workers))
    total = before["w"]["prefix_cache_queries"] + since["w"]["prefix_cache_queries"]
    assert since["w"]["prefix_cache_queries"] == pytest.approx(total / 3, rel=0.05)
    assert since["w"]["prefix_cache_hits"] / since["w"]["prefix_cache_queries"] > 0.9  # the run's own: all hit
    assert before["w"]["prefix_cache_hits"] / before["w"]["prefix_cache_queries"] < 0.6
    # the engine's own TTFT histogram, this run's share: one request (three since the worker started)
    assert since["w"]["ttft_count"] == since["w"]["ttft_le_+Inf"] == 1 and 0 < since["w"]["ttft_sum"] < 5
    assert before["w"]["ttft_count"] == 2 and since["w"]["ttft_le_0.001"] <= 1
    restarted = {"w": {"q": 3.0}, "v": {"q": 1.0}}  # "w" went down (restarted), "v" is new
    assert bc.counters_since({"w": {"q": 10.0}}, restarted) == restarted


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "router.cli", "bench", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=30)  # fmt: skip


def test_bad_arguments_exit_2_with_one_line() -> None:
    cfg = str(ROOT / "examples" / "quickstart.yaml")
    for args in (
        ("--config", cfg, "--workload", "mixed", "--rate", "fast"),
        ("--config", cfg, "--workload", "nope", "--rate", "1"),
        ("--config", cfg, "--workload", "chat", "--rate", "1", "--policies", "fastest"),
        ("--config", cfg, "--workload", "chat", "--rate", "-1"),
        ("--workload", "chat", "--rate", "1"),
        ("--config", cfg, "--workload", "chat", "--rate", "1", "--clients", "0"),
        ("--workload", "overhead", "--rate", "100", "--clients", "2"),
        ("--config", cfg, "--workload", "chat", "--rate", "nan"),  # nan passes `<= 0`: once, an endless draw
        ("--config", cfg, "--workload", "chat", "--rate", "1", "--duration", "inf"),
        ("--config", cfg, "--workload", "chat", "--rate", "1", "--warmup", "nan"),
        ("--config", cfg, "--workload", "chat", "--rate", "1e9"),  # more arrivals than any run could hold
    ):
        proc = _bench(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_with_a_gateway_predictor_the_bench_posts_each_verdict_as_feedback(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "quickstart.yaml").read_text()
    cfg = tmp_path / "with-predictor.yaml"
    predictor = "  default_agent: chat\n  predictor: {refit_interval_s: 0}\n"
    cfg.write_text(text.replace("  default_agent: chat\n", predictor))
    spec = BenchSpec(
        config_path=str(cfg), workload="mixed", policies=("predictive",), rates=(4.0,), users=None, duration_s=1.0,
        warmup_s=0.2, seeds=(1,), out=str(tmp_path / "out"), speedup=25.0, drain_s=15.0,
    )  # fmt: skip
    run_bench(spec)
    logs = (tmp_path / "out" / "logs").glob("requests-*.jsonl")
    lines = [json.loads(x) for log in logs for x in log.read_text().splitlines()]
    requests = {r["request_id"] for r in lines if r.get("type") != "feedback" and "request_id" in r}
    feedback = [r for r in lines if r.get("type") == "feedback"]
    assert feedback and {r["request_id"] for r in feedback} <= requests
    assert {r["score"] for r in feedback} <= {0.0, 1.0}
    stages: dict[str, list[int]] = {}  # x-workflow-stage: 0, 1, 2, ... within each workflow
    for r in sorted((r for r in lines if r.get("endpoint")), key=lambda r: r["ts"]):
        stages.setdefault(r["workflow_id"], []).append(r["workflow_stage"])
    assert stages and all(s == list(range(len(s))) for s in stages.values())


def test_replicas_share_one_port_and_redis_state(tmp_path: Path, redis_prefix: str) -> None:
    """`--replicas 2`: two gateway processes on one SO_REUSEPORT port, one Redis fleet view, both serving."""
    text = (ROOT / "examples" / "quickstart.yaml").read_text()
    cfg = tmp_path / "redis.yaml"
    cfg.write_text(text.replace("state: memory", f"state: redis://127.0.0.1:6379/0?prefix={redis_prefix}"))
    assert "redis://" in cfg.read_text()
    spec = BenchSpec(
        config_path=str(cfg), workload="chat", policies=("least_outstanding",), rates=(40.0,), users=None,
        duration_s=1.5, warmup_s=0.2, seeds=(1,), out=str(tmp_path / "out"), speedup=25.0, drain_s=15.0,
        plots=False, replicas=2,
    )  # fmt: skip
    run_bench(spec)
    (entry,) = json.loads((tmp_path / "out" / "results.json").read_text())
    assert entry["errors"] == 0 and entry["config"]["gateway_replicas"] == 2 and entry["config"]["client_pools"] == 16
    logs = sorted((tmp_path / "out" / "logs").glob("requests-*-r*.jsonl"))
    assert len(logs) == 2
    served = [len(p.read_text().splitlines()) for p in logs]
    assert all(n > 0 for n in served) and sum(served) >= entry["requests"], served


def test_replicas_need_redis_state() -> None:
    proc = _bench("--config", str(ROOT / "examples" / "quickstart.yaml"), "--workload", "chat", "--rate", "1",
                  "--replicas", "2")  # fmt: skip
    assert proc.returncode == 2 and "--replicas" in proc.stderr and "redis" in proc.stderr, proc.stderr


def test_load_split_over_client_processes_runs_the_same_workflows(tmp_path: Path) -> None:
    """`--clients 2`: two spawned client processes share the run's clock and arrivals; together they run
    exactly the workflows one process runs (workflow i goes to process i % 2), and their requests are
    all in the one results entry."""
    entries = {}
    for n in (1, 2):
        spec = BenchSpec(
            config_path=str(ROOT / "examples" / "quickstart.yaml"), workload="mixed", policies=("round_robin",),
            rates=(6.0,), users=None, duration_s=1.0, warmup_s=0.2, seeds=(3,), out=str(tmp_path / f"c{n}"),
            speedup=25.0, drain_s=15.0, plots=False, clients=n,
        )  # fmt: skip
        run_bench(spec)
        (entries[n],) = json.loads((tmp_path / f"c{n}" / "results.json").read_text())
        assert entries[n]["errors"] == 0 and entries[n]["config"]["client_processes"] == n
    assert entries[1]["workflows"] == entries[2]["workflows"] > 2
    assert entries[2]["requests"] > 0

    def workflow_ids(n: int) -> set[str]:
        logs = (tmp_path / f"c{n}" / "logs").glob("requests-*.jsonl")
        return {json.loads(line)["workflow_id"] for p in logs for line in p.read_text().splitlines()}

    assert workflow_ids(1) == workflow_ids(2)


def test_a_profiles_digest_follows_its_terms_not_its_provenance(tmp_path: Path) -> None:
    from chimera_bench.runner import _profile_digest
    from router.core.profile import PROFILE_DIR

    shipped = json.loads((PROFILE_DIR / "h200-qwen2.5-7b.json").read_text())
    noted, refit = tmp_path / "noted.json", tmp_path / "refit.json"
    noted.write_text(json.dumps({**shipped, "provenance": {"notes": "moved"}, "raw": {}}))
    refit.write_text(json.dumps({**shipped, "step_time_s": {**shipped["step_time_s"], "base": 0.005}}))
    assert _profile_digest("h200-qwen2.5-7b") == _profile_digest(str(noted)) != _profile_digest(str(refit))
    assert _profile_digest(str(tmp_path / "none.json")) is None
