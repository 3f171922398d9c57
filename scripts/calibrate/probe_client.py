"""`probe.py`'s request engine, run in its client worker processes: one /v1/completions request per spec
(streamed or not, ``ignore_eos``, greedy), timed token by token from the client side.

Only the standard library and httpx (it runs on the lent GPU machine's bare Python too).
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx


def make_prompt(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randint(3, 150000)}" for _ in range(n))


def _count_tokens(choice: dict) -> int:
    ids = choice.get("token_ids")
    if ids is not None:
        return len(ids)
    return len(choice.get("text", "").split())


async def _one(client: httpx.AsyncClient, url: str, model: str, spec: dict, t_start: float) -> dict:
    """spec: id, prompt, out, delay, stream, seed. Times returned are perf_counter seconds (system-wide)."""
    prompt: str | list[int] = make_prompt(spec["prompt"], spec["seed"])
    if spec.get("ids"):  # token ids: skips the front end's tokenizer
        prompt = [int(w[1:]) for w in prompt.split()]
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": spec["out"],
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": bool(spec["stream"]),
    }
    if spec["stream"]:
        body["stream_options"] = {"include_usage": True}
        if spec["out"] > 1:
            body["return_token_ids"] = True
    delay = t_start + spec.get("delay", 0.0) - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    res = {"id": spec["id"], "prompt": spec["prompt"], "out_req": spec["out"], "err": None}
    t0 = time.perf_counter()
    res["t0"] = t0
    times: list[float] = []
    usage = None
    try:
        if spec["stream"]:
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    res["err"] = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                    return res
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    now = time.perf_counter()
                    d = json.loads(line[6:])
                    if d.get("usage"):
                        usage = d["usage"]
                    for ch in d.get("choices") or ():
                        k = _count_tokens(ch)
                        if k == 0 and ch.get("finish_reason") is None and not times:
                            k = 1  # an empty first delta still marks the first token
                        times.extend([now] * k)
        else:
            r = await client.post(url + "/v1/completions", json=body)
            if r.status_code != 200:
                res["err"] = f"HTTP {r.status_code}: {r.text[:200]}"
                return res
            usage = r.json().get("usage")
    except Exception as e:  # a probe records failures instead of dying
        res["err"] = f"{type(e).__name__}: {e}"
        return res
    end = time.perf_counter()
    res["end"] = end
    res["e2e"] = end - t0
    res["n_out"] = (usage or {}).get("completion_tokens") or len(times)
    res["n_prompt"] = (usage or {}).get("prompt_tokens")
    if spec["stream"] and times:
        res["ttft"] = times[0] - t0
        res["chunks"] = len(set(times))
        res["times"] = times  # absolute arrival time of every output token
    return res


async def _run_specs_async(url: str, model: str, specs: list[dict], t_start: float, req_timeout_s: float) -> list[dict]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(req_timeout_s, connect=30.0), limits=limits) as c:
        return await asyncio.gather(*[_one(c, url, model, s, t_start) for s in specs])


def run_specs(args: tuple) -> list[dict]:
    """(url, model, specs, t_start, timeout) -> each spec's result (a picklable entry point for a pool)."""
    url, model, specs, t_start, timeout = args
    return asyncio.run(_run_specs_async(url, model, specs, t_start, timeout))
