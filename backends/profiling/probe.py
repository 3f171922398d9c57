"""Time a live OpenAI-compatible worker (vLLM, or `chimera sim`) for its step-time profile.

Every request is a /v1/completions with ``ignore_eos``, greedy sampling and an explicit ``max_tokens``, so that
two servers do exactly the same work; prompts are fresh random token ids, so the prefix cache never hits and a
prompt's length is its length in tokens whatever the model's tokenizer. Times are taken on the client side, token
by token; the server's vllm:* counters and histograms are scraped before and after every batch and kept as
deltas. Phases (:class:`Grid`):

* warm-up: two small requests, one long prompt, then a burst of requests sent at once (its makespan is what the
  API server's intake costs per request: ``frontend_s.per_request``);
* ``ttft``: TTFT of one request by prompt length (the median of ``ttft_reps``, each length warmed first);
* ``tpot``: decode by batch size at each prompt length: TPOT p50 as ``vllm bench serve`` defines it
  ((e2e - TTFT) / (tokens - 1)) and the steady decode step (the inter-token time while every stream of the batch
  decodes: one decode step of ``batch`` sequences); batches above vLLM's CUDA-graph limit give the eager steps;
* ``mix``: a decoding batch with long prompts injected mid-way: the injected TTFT and the decoders' largest gap
  (one mixed prefill + decode step).

Streams are spread over client processes, so that the client never limits a fast server. Times are kept in the
worker's own seconds: wall seconds x ``speedup`` (a simulated worker running faster than real time).
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import httpx2 as httpx

from backends.profiling.client import Result, Spec, Worker, parse_metrics, run_specs
from router.core import paths
from router.core.errors import ConfigError, WorkerError

PHASES = ("ttft", "tpot", "mix")
BURST_PROMPT, BURST_OUT = 64, 16  # the warm-up burst's requests (the fit replays the same)


@dataclass(frozen=True)
class Grid:
    """What the probe measures. The default takes about a minute on a real H200 worker."""

    phases: tuple[str, ...] = PHASES
    ttft_prompts: tuple[int, ...] = (32, 128, 512, 1024, 2048, 4096, 8192, 12288)
    ttft_reps: int = 3  # measured requests per prompt length (their median)
    tpot_prompts: tuple[int, ...] = (256, 2048)
    batches: tuple[int, ...] = (1, 8, 32, 64, 128, 256)
    tpot_out: int = 128  # tokens each tpot stream decodes
    mix_batch: int = 32
    mix_out: int = 640  # tokens each mix stream decodes (a few seconds' worth)
    mix_inject: tuple[int, ...] = (2048, 8192)  # prompt lengths injected into the decoding batch ...
    mix_at: tuple[float, ...] = ()  # ... and when (seconds after the batch starts; (): spread over its decode)
    burst: int = 256  # warm-up burst of requests sent at once (0: none, no frontend_s.per_request)

    def check(self) -> None:
        """ConfigError naming the flag of a grid that cannot run."""
        if bad := [p for p in self.phases if p not in PHASES]:
            raise ConfigError(f"unknown phase(s) {', '.join(bad)} (known: {', '.join(PHASES)})", key="--phases")
        for key in ("ttft_prompts", "tpot_prompts", "batches", "mix_inject"):
            if any(v < 1 for v in getattr(self, key)):
                raise ConfigError("must be positive integers", key="--" + key.replace("_", "-"))
        for key in ("ttft_reps", "tpot_out", "mix_batch", "mix_out"):
            if getattr(self, key) < (2 if key.endswith("_out") else 1):
                raise ConfigError(f"too small: {getattr(self, key)}", key="--" + key.replace("_", "-"))
        if self.burst < 0:
            raise ConfigError("must be 0 or more", key="--burst")
        if (self.mix_at and len(self.mix_at) != len(self.mix_inject)) or any(t < 0 for t in self.mix_at):
            raise ConfigError("needs one time (>= 0 s) per --mix-inject length", key="--mix-at")


# -- the timings -------------------------------------------------------------------------------------------
def metric_delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: round(v - a.get(k, 0.0), 6) for k, v in b.items()
            if k.endswith(("_total", "_sum", "_count")) and v != a.get(k, 0.0)}  # fmt: skip


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    f, c = math.floor(k), min(math.floor(k) + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def steady_decode(rs: list[Result]) -> dict[str, float] | None:
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


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- the probe ----------------------------------------------------------------------------------------------
class Probe:
    """One probe of ``worker`` over ``grid``; :meth:`run` returns its results (what the fit reads)."""

    def __init__(self, worker: Worker, grid: Grid, *, kv_tokens: int | None = None, max_model_len: int | None = None,
                 speedup: float = 1.0, procs: int = 1, seed: int | None = None, request_timeout_s: float = 300.0,
                 log: Callable[[str], None] = _stderr) -> None:  # fmt: skip
        self.worker, self.grid, self.url, self.model = worker, grid, worker.url.rstrip("/"), worker.model
        self.scale = speedup  # measured s x speedup = the worker's own s
        self.kv_tokens = kv_tokens or worker.kv_tokens
        self.max_len = max_model_len or worker.max_model_len or 1 << 30
        self.procs, self.timeout, self.log = procs, request_timeout_s, log
        # prompts never seen by the worker, even by an earlier probe of it: its prefix cache would shorten them
        self.seed = random.SystemRandom().randrange(1 << 40) if seed is None else seed
        self.count, self.cache_hit = 0, False
        meta = {"url": self.url, "model": self.model, "version": worker.version, "procs": procs, "speedup": speedup,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "max_model_len": self.max_len,
                "kv_tokens": self.kv_tokens, "cache_config": worker.cache_config, "seed": self.seed,
                "grid": asdict(grid)}  # fmt: skip
        self.res: Result = {"meta": meta}
        self.pool: Any = None

    def spec(self, prompt: int, out: int, delay: float = 0.0, stream: bool = True) -> Spec:
        self.count += 1
        return {"id": self.count, "prompt": prompt, "out": out, "delay": delay / self.scale,
                "seed": self.seed * 1_000_003 + self.count, "stream": stream}  # fmt: skip

    def fits(self, prompt: int, out: int, n: int = 1, also: int = 0) -> bool:
        """Whether ``n`` requests of ``prompt`` + ``out`` tokens (and ``also`` KV tokens more) fit the worker's
        context and KV at once."""
        block = int(self.worker.cache_config.get("block_size") or 16)
        need = n * -(-(prompt + out) // block) * block + also  # whole KV blocks each
        return prompt + out <= self.max_len and (self.kv_tokens is None or need <= self.kv_tokens)

    def lag(self, delta: dict[str, float]) -> float | None:
        """A simulated worker's mean lateness per step over a batch (its sim:engine_step_lag_seconds), in its own
        milliseconds; None for a real worker."""
        n = delta.get("sim:engine_step_lag_seconds_count")
        return round(delta.get("sim:engine_step_lag_seconds_sum", 0.0) / n * 1e3 * self.scale, 4) if n else None

    def metrics(self, http: httpx.Client) -> dict[str, float]:
        try:
            return parse_metrics(http.get(self.url + paths.METRICS).text)
        except httpx.HTTPError:
            return {}

    def batch(self, specs: list[Spec]) -> tuple[list[Result], dict[str, float]]:
        """Run ``specs`` at once over the client processes; times in the worker's seconds from the batch start.
        Raises WorkerError when every request failed."""
        with httpx.Client(timeout=30) as http:
            m0 = self.metrics(http)
            pooled = self.pool is not None and len(specs) > 1
            t_start = time.perf_counter() + (0.3 if pooled else 0.02)
            if pooled:
                n = min(self.procs, len(specs))
                jobs = [(self.url, self.model, specs[i::n], t_start, self.timeout) for i in range(n)]
                rs = [r for part in self.pool.map(run_specs, jobs) for r in part]
            else:
                rs = run_specs((self.url, self.model, specs, t_start, self.timeout))
            m1 = self.metrics(http)
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
        delta = metric_delta(m0, m1)
        if delta.get("vllm:prefix_cache_hits_total", 0) > 0 and not self.cache_hit:
            self.cache_hit = True  # (said once)
            self.log("warning: the worker's prefix cache hit the probe's prompts (another client sending the same "
                     "token ids?): their prefills look shorter than they are")  # fmt: skip
        errs = [r["err"] for r in rs if r["err"]]
        if errs and len(errs) == len(rs):
            raise WorkerError(f"the worker at {self.url} failed every request of a batch of {len(rs)}: {errs[0]}")
        if errs:
            self.log(f"  {len(errs)} of {len(rs)} requests failed, first: {errs[0]}")
        return rs, delta

    def warmup(self) -> None:
        w: dict[str, Any] = {}
        w["first_request_ttft_ms"] = self.batch([self.spec(32, 8)])[0][0].get("ttft", 0) * 1e3
        w["second_request_ttft_ms"] = self.batch([self.spec(32, 8)])[0][0].get("ttft", 0) * 1e3
        long = min(8192, self.max_len - 2)
        w["first_long_ttft_ms"] = self.batch([self.spec(long, 2)])[0][0].get("ttft", 0) * 1e3
        if self.grid.burst:
            rs, _ = self.batch([self.spec(BURST_PROMPT, BURST_OUT, stream=False) for _ in range(self.grid.burst)])
            w["burst"] = {"requests": self.grid.burst, "prompt": BURST_PROMPT, "out": BURST_OUT,
                          "makespan_s": max(r.get("end", 0) for r in rs),
                          "errors": sum(1 for r in rs if r["err"])}  # fmt: skip
        self.res["warmup"] = w
        self.log("warm-up: " + json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in w.items()}))

    def phase_ttft(self) -> None:
        out = []
        for n in (p for p in self.grid.ttft_prompts if self.fits(p, 1)):
            self.batch([self.spec(n, 1)])  # this shape warmed, with a prompt of its own
            ttfts, prefill = [], []
            for _ in range(self.grid.ttft_reps):
                rs, d = self.batch([self.spec(n, 1)])
                ttfts.append(rs[0].get("ttft", float("nan")) * 1e3)
                prefill.append(d.get("vllm:request_prefill_time_seconds_sum", 0) * 1e3 * self.scale)
            out.append({"prompt": n, "ttft_ms": statistics.median(ttfts), "ttft_ms_all": ttfts,
                        "server_prefill_ms": statistics.median(prefill) if any(prefill) else None})  # fmt: skip
            self.log(f"ttft prompt={n}: {out[-1]['ttft_ms']:.2f} ms (its prefill {out[-1]['server_prefill_ms']} ms)")
        self.res["ttft"] = out

    def phase_tpot(self) -> None:
        out: list[Result] = []
        g = self.grid
        for p in g.tpot_prompts:
            for b in g.batches:
                if not self.fits(p, g.tpot_out, b):
                    self.log(f"tpot prompt={p} batch={b}: skipped (more than the worker's context or KV)")
                    continue
                rs, d = self.batch([self.spec(p, g.tpot_out) for _ in range(b)])
                ok = [r for r in rs if not r["err"] and r.get("ttft") is not None and r["n_out"] > 1]
                tp = [(r["e2e"] - r["ttft"]) / (r["n_out"] - 1) for r in ok]
                steady = steady_decode(ok)
                out.append({"prompt": p, "batch": b, "out": g.tpot_out, "errors": len(rs) - len(ok),
                            "tpot_ms_p50": (pct(tp, 0.5) or 0.0) * 1e3, "steady": steady, "metrics_delta": d,
                            "sim_lag_ms": self.lag(d)})  # fmt: skip
                self.log(f"tpot prompt={p} batch={b}: p50 {out[-1]['tpot_ms_p50']:.2f} ms, "
                         f"steady {(steady or {}).get('step_ms', 0):.2f} ms")  # fmt: skip
        self.res["tpot"] = out
        late = [f"b{t['batch']} p{t['prompt']}" for t in out
                if t["sim_lag_ms"] and t["steady"] and t["sim_lag_ms"] > 0.5 * t["steady"]["step_ms"]]  # fmt: skip
        if late:  # its steps keep their schedule, but tokens leave late and unevenly
            self.log(f"warning: the simulated worker ran more than half a step late at {', '.join(late)}: "
                     "a lower --speedup measures it better")  # fmt: skip

    def phase_mix(self) -> None:
        """``mix_batch`` streams decoding; prompts of ``mix_inject`` tokens sent at ``mix_at`` seconds."""
        b, dec_out, g = self.grid.mix_batch, self.grid.mix_out, self.grid
        plan = [(n, at) for n, at in zip(g.mix_inject, g.mix_at or self.spread(), strict=True) if self.fits(n, 1)]
        if not plan or not self.fits(256, dec_out, b, also=sum(n + 16 for n, _ in plan)):
            self.log("mix: skipped (more than the worker's context or KV)")
            return
        specs = [self.spec(256, dec_out) for _ in range(b)]
        inject = [(self.spec(n, 1, delay=at), n, at) for n, at in plan]
        rs, d = self.batch(specs + [s for s, _, _ in inject])
        by_id = {r["id"]: r for r in rs}
        dec = [r for r in rs if r["out_req"] == dec_out and r.get("times")]
        base = [statistics.median(t2 - t1 for t1, t2 in zip(r["times"][5:40], r["times"][6:41], strict=False))
                for r in dec if len(r["times"]) > 6]  # fmt: skip
        res: Result = {"batch": b, "decode_prompt": 256, "decode_out": dec_out, "inject": [],
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
            gap = res["inject"][-1]["max_gap_ms"]
            self.log(f"mix inject {n}: ttft {r['ttft'] * 1e3:.1f} ms, decoders' gap "
                     + (f"{gap:.1f} ms" if gap is not None else "none seen"))  # fmt: skip
        self.res["mix"] = res

    def spread(self) -> list[float]:
        """Injection times over the first 80 % of the decoders' run, as long as the tpot phase's steady step at the
        batch nearest ``mix_batch`` says it lasts (5 ms steps where it did not run)."""
        steps = [(abs(t["batch"] - self.grid.mix_batch), t["steady"]["step_ms"]) for t in self.res.get("tpot", [])
                 if t["steady"] and t["prompt"] <= 2048]  # fmt: skip
        run_s = self.grid.mix_out * (min(steps)[1] if steps else 5.0) / 1e3
        n = len(self.grid.mix_inject)
        return [round(run_s * 0.8 * (i + 1) / (n + 1), 3) for i in range(n)]

    def run(self, save: Callable[[Result], None] | None = None) -> Result:
        """Every phase of the grid; ``save`` is handed the results so far after each."""
        methods = mp.get_all_start_methods()  # forked: the clients start at once (the probe runs no threads)
        if self.procs > 1:
            self.pool = mp.get_context("fork" if "fork" in methods else "spawn").Pool(self.procs)
        try:
            self.warmup()
            for phase in self.grid.phases:
                t = time.monotonic()
                getattr(self, f"phase_{phase}")()
                self.res["meta"][f"wall_{phase}_s"] = round(time.monotonic() - t, 1)
                if save is not None:
                    save(self.res)
        finally:
            if self.pool is not None:
                self.pool.terminate()
        return self.res
