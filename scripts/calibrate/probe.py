#!/usr/bin/env python3
"""Probe a live OpenAI-compatible worker (vLLM, or `chimera sim`) for the simulator's step-time profile.

Every request is a /v1/completions with ``ignore_eos``, greedy sampling and an explicit ``max_tokens``,
so that two servers do exactly the same work; prompts are fresh random words (``w17 w203 ...``), so the
prefix cache never hits. Times are taken on the client side, token by token; the server's own vllm:*
counters and histograms are scraped before and after every batch and kept as deltas. Phases:

* warm-up: two small requests, an 8192-token prompt, then a burst of 256 requests sent at once (its
  makespan is what the API server's intake costs per request: ``frontend_s.per_request``);
* ``ttft``: TTFT of one request by prompt length (the median of ``--ttft-reps``, each length warmed first);
* ``tpot``: decode by batch size at two prompt lengths: TPOT p50 as ``vllm bench serve`` defines it
  ((e2e - TTFT) / (tokens - 1)) and the steady decode step (the inter-token time while every stream of
  the batch decodes: one decode step of ``batch`` sequences); batches above vLLM's CUDA-graph limit
  (128 by default) give the eager steps' cost;
* ``mix``: a decoding batch with long prompts injected mid-way: the injected TTFT and the decoders'
  largest gap (one mixed prefill + decode step).

    python scripts/calibrate/probe.py --url http://127.0.0.1:8001 --model qwen2.5-0.5b --out probe.json
    python scripts/calibrate/probe.py ... --speedup 0.5   # a sim running 2x slower than real: times scaled back
    python scripts/calibrate/fit_profile.py --model qwen2.5-0.5b probe.json --out my-0.5b.json

Streams are spread over ``--procs`` client processes, so that the client never limits a fast server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import random
import re
import statistics
import sys
import time
from typing import Any

import httpx

PHASES = ("ttft", "tpot", "mix")
TTFT_PROMPTS = (32, 128, 512, 1024, 2048, 4096, 8192, 12288)
TPOT_BATCHES = (1, 8, 32, 64, 128, 256)
TPOT_PROMPTS = (256, 2048)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


# -- the client (run in the pool's processes) ---------------------------------------------------------------
def make_prompt(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randint(3, 150000)}" for _ in range(n))


async def _one(client: httpx.AsyncClient, url: str, model: str, spec: dict[str, Any], t_start: float) -> dict[str, Any]:
    """One request of ``spec`` (id, prompt, out, delay, seed, stream); times are perf_counter seconds (system-wide)."""
    body: dict[str, Any] = {"model": model, "prompt": make_prompt(spec["prompt"], spec["seed"]),
                            "max_tokens": spec["out"], "ignore_eos": True, "temperature": 0.0, "stream": spec["stream"]}
    if spec["stream"]:
        body["stream_options"] = {"include_usage": True}
    if spec["stream"] and spec["out"] > 1:
        body["return_token_ids"] = True  # vLLM: one id per token, however the text chunks fall
    await asyncio.sleep(max(0.0, t_start + spec["delay"] - time.perf_counter()))
    res: dict[str, Any] = {"id": spec["id"], "prompt": spec["prompt"], "out_req": spec["out"], "err": None}
    t0 = res["t0"] = time.perf_counter()
    times: list[float] = []
    usage: dict[str, Any] = {}
    try:
        if not spec["stream"]:
            r = await client.post(url + "/v1/completions", json=body)
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


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], res: dict[str, Any],
                  times: list[float]) -> None:  # fmt: skip
    """A streamed request: every output token's arrival time into ``times``, the usage into ``res``."""
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            res["err"] = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
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


def run_specs(args: tuple[str, str, list[dict[str, Any]], float, float]) -> list[dict[str, Any]]:
    """(url, model, specs, t_start, timeout) -> each spec's result: the pool's entry point."""
    url, model, specs, t_start, timeout = args

    async def run() -> list[dict[str, Any]]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=30.0), limits=limits) as c:
            return await asyncio.gather(*[_one(c, url, model, s, t_start) for s in specs])

    return asyncio.run(run())


# -- what is read off the server and the timings ------------------------------------------------------------
def parse_metrics(text: str) -> dict[str, float]:
    """vllm:* samples summed over label sets (histogram buckets dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line) if line.startswith(("vllm:", "sim:")) else None
        if m and not m.group(1).endswith("_bucket"):
            try:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
            except ValueError:
                continue
    return out


def metric_delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: round(v - a.get(k, 0.0), 6) for k, v in b.items()
            if k.endswith(("_total", "_sum", "_count")) and v != a.get(k, 0.0)}  # fmt: skip


def cache_config(text: str) -> dict[str, str]:
    """The labels of vLLM's ``vllm:cache_config_info`` (num_gpu_blocks, block_size, ...)."""
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            return dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
    return {}


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    f, c = math.floor(k), min(math.floor(k) + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def steady_decode(rs: list[dict[str, Any]]) -> dict[str, float] | None:
    """Inter-token time while *every* stream of the batch decodes: a pure decode step of len(rs) sequences."""
    rs = [r for r in rs if len(r.get("times", ())) > 2]
    if not rs:
        return None
    a, b = max(r["times"][0] for r in rs), min(r["times"][-1] for r in rs)
    if b <= a:
        return None
    steps = [(b - a) / k for r in rs if (k := sum(1 for t in r["times"] if a < t <= b)) >= 3]
    ctx_mid = [r["prompt"] + sum(1 for t in r["times"] if t <= (a + b) / 2) for r in rs]
    if not steps:
        return None
    return {"step_ms": statistics.median(steps) * 1e3, "window_s": b - a, "ctx_mid": statistics.mean(ctx_mid),
            "seqs": len(rs)}  # fmt: skip


# -- the probe ----------------------------------------------------------------------------------------------
class Probe:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a, self.url, self.scale = a, a.url.rstrip("/"), a.speedup  # measured s x speedup = modelled s
        self.pool = mp.get_context("fork").Pool(a.procs) if a.procs > 1 else None
        self.seed = a.seed * 1_000_003
        self.http = httpx.Client(timeout=30)
        meta = {"url": self.url, "model": a.model, "procs": a.procs, "speedup": a.speedup,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "argv": sys.argv[1:]}  # fmt: skip
        self.res: dict[str, Any] = {"meta": meta}

    def spec(self, prompt: int, out: int, delay: float = 0.0, stream: bool = True) -> dict[str, Any]:
        self.seed += 2
        return {"id": self.seed, "prompt": prompt, "out": out, "delay": delay / self.scale, "seed": self.seed + 1,
                "stream": stream}

    def metrics(self) -> tuple[str, dict[str, float]]:
        try:
            text = self.http.get(self.url + "/metrics").text
        except httpx.HTTPError:
            return "", {}
        return text, parse_metrics(text)

    def batch(self, specs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """Run ``specs`` at once over the client processes; times in modelled seconds from the batch start."""
        _, m0 = self.metrics()
        pooled = self.pool is not None and len(specs) > 1
        t_start = time.perf_counter() + (0.3 if pooled else 0.02)
        if self.pool is not None and pooled:
            n = min(self.a.procs, len(specs))
            jobs = [(self.url, self.a.model, specs[i::n], t_start, self.a.request_timeout) for i in range(n)]
            rs = [r for part in self.pool.map(run_specs, jobs) for r in part]
        else:
            rs = run_specs((self.url, self.a.model, specs, t_start, self.a.request_timeout))
        _, m1 = self.metrics()
        rs.sort(key=lambda r: r["id"])
        s = self.scale
        for r in rs:
            for k in ("e2e", "ttft"):
                if k in r:
                    r[k] *= s
            for k in ("t0", "end"):
                if k in r:
                    r[k] = (r[k] - t_start) * s
            if "times" in r:
                r["times"] = [(t - t_start) * s for t in r["times"]]
        errs = [r["err"] for r in rs if r["err"]]
        if errs:
            print(f"  {len(errs)} errors, first: {errs[0]}", file=sys.stderr)
        return rs, metric_delta(m0, m1)

    def log(self, *x: object) -> None:
        print(f"[{self.a.model}]", *x, flush=True)

    def warmup(self) -> None:
        w: dict[str, float] = {}
        w["first_request_ttft_ms"] = self.batch([self.spec(32, 8)])[0][0].get("ttft", 0) * 1e3
        w["second_request_ttft_ms"] = self.batch([self.spec(32, 8)])[0][0].get("ttft", 0) * 1e3
        w["first_8192_ttft_ms"] = self.batch([self.spec(8192, 2)])[0][0].get("ttft", 0) * 1e3
        rs, _ = self.batch([self.spec(64, 16, stream=False) for _ in range(256)])  # (as the fit replays it)
        w["burst256_makespan_s"] = max(r.get("end", 0) for r in rs)
        self.res["warmup"] = w
        self.log("warmup", json.dumps({k: round(v, 2) for k, v in w.items()}))

    def phase_ttft(self) -> None:
        out = []
        for n in (p for p in TTFT_PROMPTS if p + 1 <= self.a.max_model_len):
            self.batch([self.spec(n, 1)])  # this shape warmed, with a prompt of its own
            ttfts, prefill = [], []
            for _ in range(self.a.ttft_reps):
                rs, d = self.batch([self.spec(n, 1)])
                ttfts.append(rs[0].get("ttft", float("nan")) * 1e3)
                prefill.append(d.get("vllm:request_prefill_time_seconds_sum", 0) * 1e3 * self.scale)
            out.append({"prompt": n, "ttft_ms": statistics.median(ttfts), "ttft_ms_all": ttfts,
                        "server_prefill_ms": statistics.median(prefill) if any(prefill) else None})  # fmt: skip
            self.log(f"ttft prompt={n}: {out[-1]['ttft_ms']:.2f} ms (vLLM's prefill {out[-1]['server_prefill_ms']})")
        self.res["ttft"] = out

    def phase_tpot(self) -> None:
        out = []
        for p in TPOT_PROMPTS:
            for b in self.a.batches:
                rs, d = self.batch([self.spec(p, self.a.tpot_out) for _ in range(b)])
                ok = [r for r in rs if not r["err"] and r.get("ttft") is not None and r["n_out"] > 1]
                tp = [(r["e2e"] - r["ttft"]) / (r["n_out"] - 1) for r in ok]
                steady = steady_decode(ok)
                out.append({"prompt": p, "batch": b, "out": self.a.tpot_out, "errors": len(rs) - len(ok),
                            "tpot_ms_p50": (pct(tp, 0.5) or 0.0) * 1e3, "steady": steady,
                            "metrics_delta": d})  # fmt: skip
                self.log(f"tpot prompt={p} batch={b}: p50 {out[-1]['tpot_ms_p50']:.2f} ms, "
                         f"steady {(steady or {}).get('step_ms', 0):.2f} ms")  # fmt: skip
        self.res["tpot"] = out

    def phase_mix(self) -> None:
        """``--mix-batch`` streams decoding; prompts of ``--mix-inject`` tokens sent at ``--mix-at`` seconds."""
        b, dec_out = self.a.mix_batch, self.a.mix_out
        specs = [self.spec(256, dec_out) for _ in range(b)]
        inject = [(self.spec(n, 1, delay=at), n, at) for n, at in zip(self.a.mix_inject, self.a.mix_at, strict=True)]
        rs, d = self.batch(specs + [s for s, _, _ in inject])
        by_id = {r["id"]: r for r in rs}
        dec = [r for r in rs if r["out_req"] == dec_out and r.get("times")]
        base = [statistics.median(t2 - t1 for t1, t2 in zip(r["times"][5:40], r["times"][6:41], strict=False))
                for r in dec if len(r["times"]) > 6]  # fmt: skip
        res: dict[str, Any] = {"batch": b, "decode_prompt": 256, "decode_out": dec_out, "inject": [],
                               "baseline_itl_ms": statistics.median(base) * 1e3 if base else None,
                               "metrics_delta": d, "errors": sum(1 for r in rs if r["err"])}  # fmt: skip
        for sp, n, at in inject:
            r = by_id[sp["id"]]
            if r["err"] or r.get("ttft") is None:
                res["inject"].append({"prompt": n, "at_s": at, "err": r["err"]})
                continue
            t_in, t_first = r["t0"], r["t0"] + r["ttft"]
            gaps, ctx = [], []
            for x in dec:  # each decoder's largest gap while the prompt was prefilled: the mixed step
                ts = x["times"]
                itl = [(ts[i] - ts[i - 1], i) for i in range(1, len(ts)) if t_in < ts[i] <= t_first + 0.05]
                if itl:
                    gap, i = max(itl)
                    gaps.append(gap)
                    ctx.append(256 + i)
            res["inject"].append({"prompt": n, "at_s": at, "ttft_ms": r["ttft"] * 1e3,
                                  "max_gap_ms": statistics.median(gaps) * 1e3 if gaps else None,
                                  "ctx_at_gap": statistics.mean(ctx) if ctx else None})  # fmt: skip
            self.log(f"mix inject {n}: ttft {r['ttft'] * 1e3:.1f} ms, decoders' gap {res['inject'][-1]['max_gap_ms']}")
        self.res["mix"] = res

    def save(self) -> None:
        tmp = self.a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.res, f, indent=1)
        os.replace(tmp, self.a.out)

    def run(self) -> None:
        text, _ = self.metrics()
        self.res["meta"]["cache_config"] = cache_config(text)
        self.warmup()
        self.save()
        for phase in self.a.phases:
            t = time.time()
            getattr(self, f"phase_{phase}")()
            self.res["meta"][f"wall_{phase}_s"] = round(time.time() - t, 1)
            self.save()
        if self.pool is not None:
            self.pool.close()


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the worker's base URL")
    ap.add_argument("--model", required=True, help="its served model name")
    ap.add_argument("--out", required=True, help="the probe's results (JSON), for fit_profile.py")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {','.join(PHASES)}")
    ap.add_argument("--procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                    help="client processes the streams are spread over")  # fmt: skip
    ap.add_argument("--speedup", type=float, default=1.0, help="the server's time speedup; times are scaled back")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--request-timeout", type=float, default=300)
    ap.add_argument("--max-model-len", type=int, default=16384, help="the server's: longer TTFT prompts are skipped")
    ap.add_argument("--ttft-reps", type=int, default=3, help="measured requests per prompt length (median)")
    ap.add_argument("--batches", type=_ints, default=list(TPOT_BATCHES), help="tpot batch sizes")
    ap.add_argument("--tpot-out", type=int, default=128, help="tokens each tpot stream decodes")
    ap.add_argument("--mix-batch", type=int, default=32)
    ap.add_argument("--mix-out", type=int, default=640, help="tokens each mix stream decodes (a few seconds' worth)")
    ap.add_argument("--mix-inject", type=_ints, default=[2048, 8192], help="prompt lengths injected into the batch")
    ap.add_argument("--mix-at", type=lambda s: [float(x) for x in s.split(",") if x], default=[0.8, 1.6],
                    help="when each is sent (seconds after the batch, modelled time)")  # fmt: skip
    a = ap.parse_args(argv)
    a.phases = [p for p in a.phases.split(",") if p]
    if bad := [p for p in a.phases if p not in PHASES]:
        ap.error(f"unknown phase(s) {bad}")
    if len(a.mix_at) != len(a.mix_inject):
        ap.error("--mix-at needs one time per --mix-inject length")
    Probe(a).run()


if __name__ == "__main__":
    main()
