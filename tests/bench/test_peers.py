"""`chimera bench --peers`: the real vLLM Router, SGLang router and LiteLLM proxy in front of the bench's sims."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from chimera_bench import peers
from chimera_bench.runner import BenchSpec, run_bench
from router.core.config import load_config
from router.core.errors import ChimeraError, ConfigError

ROOT = Path(__file__).resolve().parents[2]


def two_small_one_large(tmp_path: Path) -> Path:
    """The quickstart fleet with a second 1.5B worker: a model with two workers for the Rust routers to balance."""
    raw = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    raw["gateway"].pop("request_log", None)
    small = dict(raw["backends"][0], name="small-1", url="http://127.0.0.1:8003", gpu=2)
    small["sim"] = dict(small["sim"], seed=3)
    raw["backends"].insert(1, small)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_peer_spec_is_a_known_router_and_one_of_its_policies():
    assert peers.parse("vllm-router:cache_aware") == (peers.PEERS["vllm-router"], "cache_aware")
    assert peers.is_peer("litellm:least-busy") and not peers.is_peer("predictive")
    with pytest.raises(ConfigError, match=r"--peers: unknown peer 'nginx'"):
        peers.parse("nginx:round_robin")
    with pytest.raises(ConfigError, match=r"--peers: sglang-router has no policy 'consistent_hash'"):
        peers.parse("sglang-router:consistent_hash")


def test_a_missing_peer_is_one_line_naming_the_extra():
    missing = peers.PeerKind("vllm-router", "no_such_module_here", ("round_robin",), True)
    extra = r"pip install 'chimera-router\[peers\]'"
    with pytest.raises(ChimeraError, match=rf"^the peer vllm-router is not installed: {extra}$"):
        peers.check_installed(missing)


def test_each_peer_gets_the_fleet_as_its_users_deploy_it(tmp_path: Path):
    cfg = load_config(two_small_one_large(tmp_path))
    rust = peers.routes(peers.PEERS["vllm-router"], cfg, {"qwen2.5-1.5b": "http://a", "qwen2.5-7b": "http://b"})
    assert {a: (r.url, r.model) for a, r in rust.items()} == {  # each agent's first model, through its router
        "chat": ("http://a", "qwen2.5-1.5b"), "planner": ("http://b", "qwen2.5-7b"),
        "coder": ("http://b", "qwen2.5-7b"), "tester": ("http://a", "qwen2.5-1.5b"),
        "solver": ("http://b", "qwen2.5-7b"), "verifier": ("http://a", "qwen2.5-1.5b"),
    }  # fmt: skip
    groups = peers.litellm_config(cfg, "least-busy")
    assert groups["router_settings"]["routing_strategy"] == "least-busy"
    chat = [d["litellm_params"] for d in groups["model_list"] if d["model_name"] == "chat"]
    assert [(d["model"], d["api_base"]) for d in chat] == [  # one group per agent: every worker it may use
        ("openai/qwen2.5-1.5b", "http://127.0.0.1:8001/v1"), ("openai/qwen2.5-1.5b", "http://127.0.0.1:8003/v1"),
        ("openai/qwen2.5-7b", "http://127.0.0.1:8002/v1"),
    ]  # fmt: skip
    lite = peers.routes(peers.PEERS["litellm"], cfg, {"": "http://c"})
    assert (lite["coder"].url, lite["coder"].model, lite["coder"].api_key) == ("http://c", "coder", peers.LITELLM_KEY)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_peers_run_the_same_workload_beside_chimera(tmp_path: Path, capfd: pytest.CaptureFixture[str]):
    spec = BenchSpec(
        config_path=str(two_small_one_large(tmp_path)), workload="mixed",
        policies=("round_robin", "vllm-router:power_of_two", "sglang-router:cache_aware", "litellm:simple-shuffle"),
        rates=(3.0,), users=None, duration_s=2.0, warmup_s=0.0, seeds=(1,), out=str(tmp_path / "out"),
        speedup=25.0, drain_s=30.0, plots=False, clients=2,  # (a peer's routes go to each client process)
    )  # fmt: skip
    run_bench(spec)
    entries = {e["policy"]: e for e in json.loads((tmp_path / "out" / "results.json").read_text())}
    assert list(entries) == list(spec.policies)
    for name, e in entries.items():
        assert e["requests"] > 0 and e["errors"] == 0, name
        assert e["workflows"] > 0 and e["task_success"] is not None, name
    for name in ("vllm-router:power_of_two", "sglang-router:cache_aware"):  # the agent's first model only
        by_agent = entries[name]["by_agent"]
        assert by_agent["coder"]["model_share"] == {"qwen2.5-7b": 1.0}, name
        assert by_agent["tester"]["model_share"] == {"qwen2.5-1.5b": 1.0}, name
    p2c = entries["vllm-router:power_of_two"]["worker_counters"]  # both 1.5B workers served
    assert p2c["small-0"]["prefix_cache_queries"] > 0 and p2c["small-1"]["prefix_cache_queries"] > 0
    shares = entries["litellm:simple-shuffle"]["model_share"]  # the group spans both models
    assert set(shares) == {"qwen2.5-1.5b", "qwen2.5-7b"}
    logged = json.loads(next((tmp_path / "out" / "logs").glob("peer-vllm-router-power_of_two-*.json")).read_text())
    assert len(logged["commands"]) == 2 and "--worker-urls" in logged["commands"][0]  # a router per model
    # the 7B's one worker: vLLM Router refuses power_of_two over it, so its router runs round_robin, and says so
    assert logged["fallbacks"] == {"qwen2.5-7b": "round_robin"}
    assert [c[c.index("--policy") + 1] for c in logged["commands"]] == ["power_of_two", "round_robin"]
    assert "vllm-router power_of_two needs 2 workers and qwen2.5-7b has 1: its router runs round_robin" in (
        capfd.readouterr().err)


def test_a_policy_a_router_refuses_over_one_worker_falls_back():
    vllm, sglang, lite = (peers.PEERS[n] for n in ("vllm-router", "sglang-router", "litellm"))
    assert peers.model_policy(vllm, "power_of_two", 1) == "round_robin"
    assert peers.model_policy(sglang, "power_of_two", 1) == "round_robin"
    assert peers.model_policy(vllm, "power_of_two", 2) == "power_of_two"
    assert peers.model_policy(vllm, "cache_aware", 1) == "cache_aware"
    assert peers.model_policy(lite, "least-busy", 1) == "least-busy"


def test_the_bench_cli_says_a_wrong_peer_in_one_line(tmp_path: Path):
    r = subprocess.run(
        [sys.executable, "-m", "router.cli", "bench", "--config", str(ROOT / "examples" / "quickstart.yaml"),
         "--workload", "chat", "--rate", "1", "--peers", "vllm-router:least_busy", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "vllm-router has no policy 'least_busy'" in r.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_overhead_workload_measures_each_peer_streamed_and_not(tmp_path: Path):
    from chimera_bench.overhead import run_overhead

    routers = ("vllm-router:round_robin", "litellm:simple-shuffle")
    entries = run_overhead(rates=(20.0,), duration_s=1.0, warmup_s=0.5, out=str(tmp_path), pin=False,
                           peers=routers, streams=(True, False))  # fmt: skip
    assert [(e["policy"], e["stream"]) for e in entries] == [
        (name, stream) for stream in (True, False)
        for name in ("round_robin", "vllm-router:round_robin", "litellm:simple-shuffle")
    ]  # fmt: skip
    for e in entries:
        assert e["requests"] > 0 and e["errors"] == 0, e["policy"]
        assert e["added_latency_ms"]["p50"] is not None and e["direct_rps"] > 0, e["policy"]
