"""Each engine's load, read in its own terms: `chimera sim --engine` serves SGLang's, TGI's, TensorRT-LLM's and
LightLLM's metrics (and only those), and the gateway's prober reads them into `/fleet`, configured or detected."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from backends.engines import BY_ENGINE, detect
from backends.scrape import parse_metrics
from router.core.types import ENGINES
from tests.conftest import ServerThread, make_config

Sims = Callable[..., ServerThread]
OTHER_NAMES = {e: tuple(n for m in BY_ENGINE.values() if m.engine != e for n in m.running) for e in ENGINES}


@contextlib.asynccontextmanager
async def holding(targets: list[tuple[str, str]], n: int = 3, tokens: int = 4000) -> AsyncIterator[None]:
    """``n`` long streamed completions on each ``(url, model)`` worker, running while the block runs."""

    async def one(client: httpx.AsyncClient, url: str, model: str) -> None:
        body = {"model": model, "prompt": "w " * 400, "max_tokens": tokens, "stream": True, "ignore_eos": True}
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            async for _ in resp.aiter_bytes():
                pass

    async with httpx.AsyncClient(timeout=60) as client:
        tasks = [asyncio.create_task(one(client, url, model)) for url, model in targets for _ in range(n)]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_sim_serves_each_engines_own_metrics_and_endpoints(sim_server: Sims, engine: str) -> None:
    srv = sim_server(model="m", speedup=1.0, engine=engine, max_num_seqs=2)
    spec = BY_ENGINE[engine]
    async with holding([(srv.url, "m")]), httpx.AsyncClient(timeout=5) as http:
        for _ in range(100):
            text = (await http.get(srv.url + spec.metrics_path)).text
            kv = (await http.get(srv.url + spec.kv_json[0])).json()[spec.kv_json[1]] if spec.kv_json else None
            m = parse_metrics(text, spec, kv)
            if (m.running, m.waiting) == (2, 1) and m.kv_usage:
                break
            await asyncio.sleep(0.05)
        health = (await http.get(srv.url + "/health")).status_code
        models = (await http.get(srv.url + "/v1/models")).json()["data"][0]
        version = (await http.get(srv.url + "/version")).status_code
    assert not any(name in text for name in OTHER_NAMES[engine])  # its own names only
    assert ("vllm:" in text) == (engine == "vllm")
    assert detect(text) is spec
    assert (m.engine, m.running, m.waiting) == (engine, 2, 1)
    assert m.kv_usage is not None and 0.0 < m.kv_usage <= 1.0
    assert health == 200
    assert models["owned_by"] == {"tgi": "m", "trtllm": "tensorrt_llm"}.get(engine, engine)
    assert version == (200 if engine in ("vllm", "trtllm") else 404)  # SGLang, TGI and LightLLM have no /version


async def test_each_engines_identity_endpoints(sim_server: Sims) -> None:
    async with httpx.AsyncClient(timeout=5) as http:
        sglang = sim_server(model="m", engine="sglang", kv_tokens=32768)
        info = (await http.get(sglang.url + "/server_info")).json()
        assert info["max_total_num_tokens"] == 32768 and (await http.get(sglang.url + "/health_generate")).is_success
        tgi = sim_server(model="m", engine="tgi")
        assert (await http.get(tgi.url + "/info")).json()["router"] == "text-generation-router"
        trt = sim_server(model="m", engine="trtllm")
        stats = (await http.get(trt.url + "/metrics")).json()  # JSON iteration stats; Prometheus elsewhere
        assert stats[0]["numActiveRequests"] == 0 and "maxNumBlocks" in stats[0]["kvCacheStats"]
        light = sim_server(model="m", engine="lightllm")
        assert (await http.get(light.url + "/healthz")).json() == {"message": "Ok"}
        assert (await http.get(light.url + "/get_model_name")).json() == {"model_name": "m"}


def test_a_bad_engine_is_one_clear_error() -> None:
    from backends.sim.server import SimSettings, check_settings
    from router.core.errors import ProfileError

    with pytest.raises(ProfileError, match="engine must be one of vllm, sglang") as info:
        check_settings(SimSettings(engine="ollama"))
    assert info.value.setting == "engine"


def test_sglang_counts_the_total_not_each_priority() -> None:
    text = (
        'sglang:num_running_reqs{model_name="m",priority=""} 5.0\n'
        'sglang:num_running_reqs{model_name="m",priority="0"} 3.0\n'
        'sglang:num_running_reqs{model_name="m",priority="1"} 2.0\n'
        'sglang:num_queue_reqs{model_name="m",priority=""} 4.0\n'
        'sglang:token_usage{model_name="m",priority=""} 0.25\n'
    )
    m = parse_metrics(text, BY_ENGINE["sglang"])
    assert (m.running, m.waiting, m.kv_usage) == (5, 4, 0.25)


def test_tgi_kv_use_is_the_batch_ceiling_over_the_capacity() -> None:
    text = "tgi_batch_current_size 3\ntgi_queue_size 7\n"
    text += "tgi_batch_current_max_tokens 4096\ntgi_batch_max_total_tokens 16384\n"
    m = parse_metrics(text, BY_ENGINE["tgi"])
    assert (m.running, m.waiting, m.kv_usage, m.engine) == (3, 7, 0.25, "tgi")


def test_lightllm_before_1_2_counts_its_batch() -> None:
    m = parse_metrics("lightllm_batch_current_size 4\nlightllm_queue_size 2\n", BY_ENGINE["lightllm"], kv_usage=0.5)
    assert (m.running, m.waiting, m.kv_usage) == (4, 2, 0.5)


async def test_the_fleet_shows_every_engines_load_under_load(sim_server: Sims, gateway_server: Sims) -> None:
    """One worker per engine behind one gateway: vLLM and TGI with `engine:` configured, the others detected from
    their metrics (TensorRT-LLM's Prometheus text at its own path, LightLLM's KV use from /token_load). Under load
    each worker's running, waiting and KV use in /fleet are what its own metrics say."""
    sims = {e: sim_server(model=f"m-{e}", speedup=1.0, engine=e, max_num_seqs=2) for e in ENGINES}
    backends = [{"name": e, "url": s.url, "model": f"m-{e}", **({"engine": e} if e in ("vllm", "tgi") else {})}
                for e, s in sims.items()]  # fmt: skip
    cfg = make_config(backends, health={"probe_interval_s": 0.1, "probe_timeout_s": 0.5})
    gw = gateway_server(cfg, probe=True)
    async with holding([(s.url, f"m-{e}") for e, s in sims.items()]), httpx.AsyncClient(timeout=5) as http:
        for _ in range(100):
            rows = {b["name"]: b for b in (await http.get(gw.url + "/fleet")).json()["backends"]}
            if all(r["waiting"] == 1 and r["running"] == 2 for r in rows.values()):
                break
            await asyncio.sleep(0.1)
    got = {e: (r["engine"], r["running"], r["waiting"], r["kv_usage"] is not None and r["kv_usage"] > 0)
           for e, r in rows.items()}  # fmt: skip
    assert got == {e: (e, 2, 1, True) for e in ENGINES}, json.dumps(rows, indent=1)
