"""The probe's client: what a worker says of itself, and the timed requests (run in the probe's client processes).

Every request is a /v1/completions with ``ignore_eos``, greedy sampling and an explicit ``max_tokens``; its prompt
is random token ids (``make_prompt``). Times are ``perf_counter`` seconds, the same in every process of one machine.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx
from prometheus_client.parser import text_string_to_metric_families

from backends.transport import AiohttpTransport
from router.core import paths
from router.core.errors import ConfigError, WorkerConnectError, WorkerError, WorkerStatusError

_TOKEN_IDS = (1000, 30000)  # prompt token ids: inside any modern vocabulary, clear of the special tokens
Spec = dict[str, Any]
Result = dict[str, Any]


@dataclass(frozen=True)
class Worker:
    """What a worker says of itself before it is probed."""

    url: str
    model: str
    version: str | None = None  # its /version
    max_model_len: int | None = None  # its /v1/models card's
    cache_config: dict[str, str] = field(default_factory=dict)  # the labels of vllm:cache_config_info

    @property
    def kv_tokens(self) -> int | None:
        """Its KV capacity, num_gpu_blocks x block_size, where its metrics say it."""
        try:
            return int(self.cache_config["num_gpu_blocks"]) * int(self.cache_config.get("block_size", 16)) or None
        except (KeyError, ValueError):
            return None


def inspect_worker(url: str, model: str, timeout_s: float = 10.0) -> Worker:
    """The worker at ``url``: its models (``model`` must be one), version and cache config. Raises
    WorkerConnectError (not reachable), WorkerStatusError (an error answer), ConfigError (``model`` not served)."""
    url = url.rstrip("/")
    with httpx.Client(timeout=timeout_s) as http:
        models = _get(http, url + paths.MODELS)
        try:
            cards = json.loads(models.text)["data"]
            served = {str(c["id"]): c for c in cards}
        except (ValueError, KeyError, TypeError) as exc:
            raise WorkerError(f"{url}{paths.MODELS} is not an OpenAI model list: {models.text[:120]!r}") from exc
        if model not in served:
            raise ConfigError(f"the worker at {url} serves {', '.join(sorted(served)) or 'no model'}, not {model!r}",
                              key="--model")  # fmt: skip
        version = _optional(http, url + paths.VERSION)
        metrics = _optional(http, url + paths.METRICS)
    try:
        ver = json.loads(version).get("version") if version else None
    except (ValueError, AttributeError):
        ver = None
    max_len = served[model].get("max_model_len")
    return Worker(url, model, str(ver) if ver else None, max_len if isinstance(max_len, int) else None,
                  cache_config(metrics or ""))  # fmt: skip


def _get(http: httpx.Client, url: str) -> httpx.Response:
    try:
        r = http.get(url)
    except httpx.HTTPError as exc:
        raise WorkerConnectError(f"cannot reach the worker: GET {url}: {exc or type(exc).__name__}") from exc
    if r.status_code != 200:
        raise WorkerStatusError(f"GET {url} answered HTTP {r.status_code}: {r.text[:200]!r}", status_code=r.status_code)
    return r


def _optional(http: httpx.Client, url: str) -> str | None:
    try:
        r = http.get(url)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


# -- the client (run in the pool's processes) ---------------------------------------------------------------
def make_prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(*_TOKEN_IDS) for _ in range(n)]


async def _one(client: httpx.AsyncClient, url: str, model: str, spec: Spec, t_start: float) -> Result:
    """One request of ``spec`` (id, prompt, out, delay, seed, stream); times are perf_counter seconds (system-wide)."""
    body: dict[str, Any] = {"model": model, "prompt": make_prompt(spec["prompt"], spec["seed"]),
                            "max_tokens": spec["out"], "ignore_eos": True, "temperature": 0.0,
                            "stream": spec["stream"]}  # fmt: skip
    if spec["stream"]:
        body["stream_options"] = {"include_usage": True}
    if spec["stream"] and spec["out"] > 1:
        body["return_token_ids"] = True  # vLLM: one id per token, however the text chunks fall
    await asyncio.sleep(max(0.0, t_start + spec["delay"] - time.perf_counter()))
    res: Result = {"id": spec["id"], "prompt": spec["prompt"], "out_req": spec["out"], "err": None}
    t0 = res["t0"] = time.perf_counter()
    times: list[float] = []
    usage: dict[str, Any] = {}
    try:
        if not spec["stream"]:
            r = await client.post(url + paths.COMPLETIONS, json=body)
            usage = (r.json().get("usage") or {}) if r.status_code == 200 else {}
            res["err"] = None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"
        else:
            await _stream(client, url, body, res, times)
            usage = res.pop("usage", {})
    except (httpx.HTTPError, ValueError) as exc:  # a probe records failures instead of dying
        res["err"] = f"{type(exc).__name__}: {exc}"
    if res["err"]:
        return res
    res["end"] = end = time.perf_counter()
    res["e2e"] = end - t0
    res["n_out"] = usage.get("completion_tokens") or len(times)
    if times:
        res["ttft"], res["times"] = times[0] - t0, times
    return res


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], res: Result, times: list[float]) -> None:
    """A streamed request: every output token's arrival time into ``times``, the usage into ``res``."""
    async with client.stream("POST", url + paths.COMPLETIONS, json=body) as r:
        if r.status_code != 200:
            res["err"] = f"HTTP {r.status_code}: {(await r.aread())[:200].decode(errors='replace')}"
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now, d = time.perf_counter(), json.loads(line[6:])
            res["usage"] = d.get("usage") or res.get("usage") or {}
            for ch in d.get("choices") or ():
                k = len(ch["token_ids"]) if ch.get("token_ids") is not None else len(ch.get("text", "").split())
                if k == 0 and ch.get("finish_reason") is None and not times:
                    k = 1  # an empty first delta still marks the first token
                times.extend([now] * k)


def run_specs(args: tuple[str, str, list[Spec], float, float]) -> list[Result]:
    """(url, model, specs, t_start, timeout) -> each spec's result: the pool's entry point."""
    url, model, specs, t_start, timeout = args

    async def run() -> list[Result]:
        # the gateway's transport (aiohttp's pool and parser): a third of httpcore's cost per request, so that a
        # burst leaves the client as fast as a worker's API server takes it in
        transport = AiohttpTransport(httpx.Limits(max_connections=len(specs) + 1))
        async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(timeout, connect=30.0)) as c:
            return await asyncio.gather(*[_one(c, url, model, s, t_start) for s in specs])

    return asyncio.run(run())


# -- what is read off the server ---------------------------------------------------------------------------
def parse_metrics(text: str) -> dict[str, float]:
    """vllm:* (and sim:*) samples summed over label sets, histogram buckets dropped."""
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith(("vllm:", "sim:")) and not s.name.endswith("_bucket"):
                    out[s.name] = out.get(s.name, 0.0) + float(s.value)
    except (ValueError, IndexError, KeyError, TypeError):  # (what the parser raises on bad text: backends/scrape.py)
        return out
    return out


def cache_config(text: str) -> dict[str, str]:
    """The labels of vLLM's ``vllm:cache_config_info`` (num_gpu_blocks, block_size, ...)."""
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "vllm:cache_config_info":
                    return dict(s.labels)
    except (ValueError, IndexError, KeyError, TypeError):
        return {}
    return {}
