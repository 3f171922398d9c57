#!/usr/bin/env python3
"""Client-side calibration probe for any OpenAI-compatible vLLM-like server (real vLLM or chimera's sim).

Measures, from the client side, with /v1/completions, ``ignore_eos`` and explicit ``max_tokens`` so that any
two servers do exactly the same work:

* ``ttft``       TTFT of single requests by prompt length (median of 3 after a warm-up, distinct random prompts
                 so that prefix caching never hits);
* ``tpot``       decode speed by batch size at two prompt lengths: TPOT as ``vllm bench serve`` defines it
                 ((e2e - ttft) / (out - 1), first token excluded), and the *steady* decode step (the inter-token
                 time while every stream of the batch is decoding, i.e. a pure decode step of ``batch`` seqs);
* ``mix``        a decode batch with long prompts injected mid-way: TTFT of the injected prompt and the stall it
                 causes to the decoding streams (mixed prefill+decode engine steps);
* ``saturation`` output tokens/s with many concurrent streams (streaming and not);
* ``kv``         KV pressure: concurrent requests needing ~4x the KV budget; /metrics polled during the run
                 (running, waiting, KV use), preemption counter delta, e2e p50/p99, makespan.

Server-side vllm:* counters/histograms (sum, count, iteration-token buckets) are scraped before and after every
batch and stored as deltas.  Prompts are "w17 w203 ..." (one token per word with the calibration tokenizer).
Streams are spread over ``--procs`` client processes so that the client never limits a fast server.

    python scripts/calibrate/probe.py --url http://127.0.0.1:8001 --model qwen2.5-0.5b --out p.json
    python scripts/calibrate/probe.py ... --phases kv --kv-tokens 32768          # the KV-pressure probe alone
    python scripts/calibrate/probe.py ... --speedup 0.5   # server runs 2x slower than real: times scaled back

Only the standard library and httpx are needed (it runs on the lent GPU machine's bare Python too).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import re
import statistics
import sys
import threading
import time

import httpx
from probe_client import run_specs  # next to this file
from probe_stats import labels_of, metric_delta, parse_metrics, pct, steady_decode

PHASES = ("ttft", "tpot", "mix", "saturation", "kv", "psweep", "dsweep")
TTFT_PROMPTS_BRIEF = (128, 512, 2048, 8192)
TTFT_PROMPTS_EXTRA = (32, 1024, 4096, 12288)  # (16000 words trip vLLM's prompt-characters check)
PSWEEP_PROMPTS = (16, 64, 120, 128, 136, 256, 512, 1024, 2048, 4096, 8192)
DSWEEP_BATCHES = (1, 8, 32, 64, 96, 120, 128, 136, 192, 256)
TPOT_BATCHES = (1, 8, 32, 64, 128)
TPOT_PROMPTS = (256, 2048)

# ----------------------------------------------------------------------------------------------------------
# the probe


class Probe:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.url = a.url.rstrip("/")
        self.model = a.model
        self.scale = a.speedup  # measured seconds * speedup = real seconds
        self.pool = mp.get_context("fork").Pool(a.procs) if a.procs > 1 else None
        self.seed = a.seed * 1_000_003
        self.http = httpx.Client(timeout=30)
        self.res: dict = {
            "meta": {
                "url": self.url,
                "model": self.model,
                "procs": a.procs,
                "speedup": a.speedup,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "argv": sys.argv[1:],
            }
        }

    # -- plumbing
    def next_seed(self) -> int:
        self.seed += 1
        return self.seed

    def spec(self, prompt: int, out: int, stream: bool = True, delay: float = 0.0, ids: bool = False) -> dict:
        return {
            "id": self.next_seed(),
            "prompt": prompt,
            "out": out,
            "stream": stream,
            "delay": delay / self.scale,
            "seed": self.next_seed(),
            "ids": ids,
        }

    def metrics(self) -> tuple[str, dict[str, float]]:
        try:
            t = self.http.get(self.url + "/metrics").text
        except Exception:
            return "", {}
        return t, parse_metrics(t)

    def batch(self, specs: list[dict]) -> tuple[list[dict], dict]:
        """Run specs concurrently (spread over the client processes); scale times; return results, delta."""
        _, m0 = self.metrics()
        timeout = self.a.request_timeout
        use_pool = self.pool is not None and len(specs) > 1
        t_start = time.perf_counter() + (0.3 if use_pool else 0.02)
        if use_pool:
            n = min(self.a.procs, len(specs))
            parts = [specs[i::n] for i in range(n)]
            rs = [
                r
                for part in self.pool.map(run_specs, [(self.url, self.model, p, t_start, timeout) for p in parts])
                for r in part
            ]
        else:
            rs = run_specs((self.url, self.model, specs, t_start, timeout))
        _, m1 = self.metrics()
        rs.sort(key=lambda r: r["id"])
        s = self.scale
        for r in rs:  # back to real time, relative to the batch start
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

    def save(self) -> None:
        tmp = self.a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.res, f, indent=1)
        os.replace(tmp, self.a.out)

    def late(self) -> bool:
        return bool(self.a.deadline) and time.time() > self.a.deadline

    def log(self, *x: object) -> None:
        print(f"[{self.model}]", *x, flush=True)

    # -- phases
    def warmup(self) -> None:
        w: dict = {}
        rs, _ = self.batch([self.spec(32, 8)])
        w["first_request_ttft_ms"] = rs[0].get("ttft", 0) * 1e3
        w["first_request_e2e_ms"] = rs[0].get("e2e", 0) * 1e3
        rs, _ = self.batch([self.spec(32, 8)])
        w["second_request_ttft_ms"] = rs[0].get("ttft", 0) * 1e3
        if not self.a.quick:
            rs, _ = self.batch([self.spec(8192, 2)])
            w["first_8192_ttft_ms"] = rs[0].get("ttft", 0) * 1e3
            rs, _ = self.batch([self.spec(64, 16, stream=False) for _ in range(256)])
            w["burst256_makespan_s"] = max(r.get("end", 0) for r in rs)
            rs, _ = self.batch([self.spec(2048, 16, stream=False) for _ in range(8)])
        self.res["warmup"] = w
        self.log("warmup", json.dumps({k: round(v, 2) for k, v in w.items()}))

    def phase_ttft(self) -> None:
        out = []
        prompts = sorted(set(TTFT_PROMPTS_BRIEF) | (set() if self.a.quick else set(TTFT_PROMPTS_EXTRA)))
        prompts = [p for p in prompts if p + 1 <= self.a.max_model_len]
        for n in prompts:
            self.batch([self.spec(n, 1)])  # warm this shape with a distinct prompt
            ttfts, deltas = [], []
            for _ in range(self.a.ttft_reps):
                rs, d = self.batch([self.spec(n, 1)])
                ttfts.append(rs[0].get("ttft", float("nan")) * 1e3)
                deltas.append(d)
            srv = [d.get("vllm:time_to_first_token_seconds_sum", 0) * 1e3 * self.scale for d in deltas]
            pre = [d.get("vllm:request_prefill_time_seconds_sum", 0) * 1e3 * self.scale for d in deltas]
            out.append(
                {
                    "prompt": n,
                    "ttft_ms": statistics.median(ttfts),
                    "ttft_ms_all": ttfts,
                    "server_ttft_ms": statistics.median(srv) if any(srv) else None,
                    "server_prefill_ms": statistics.median(pre) if any(pre) else None,
                    "iteration_tokens_count": deltas[len(deltas) // 2].get("vllm:iteration_tokens_total_count"),
                }
            )
            self.log(f"ttft prompt={n}: {out[-1]['ttft_ms']:.2f} ms (server {out[-1]['server_ttft_ms']})")
            if self.late():
                break
        self.res["ttft"] = out

    def _ttft_sample(self, n: int, ids: bool = False) -> list[float]:
        """[client TTFT, server TTFT, server prefill time] in ms of one n-token prompt."""
        rs, d = self.batch([self.spec(n, 1, ids=ids)])
        srv = d.get("vllm:time_to_first_token_seconds_sum", 0) * 1e3 * self.scale
        pre = d.get("vllm:request_prefill_time_seconds_sum", 0) * 1e3 * self.scale
        return [rs[0].get("ttft", float("nan")) * 1e3, srv, pre]

    def phase_psweep(self) -> None:
        """TTFT of single prompts across vLLM's CUDA-graph limit (128 tokens), repeated round-robin."""
        prompts = [p for p in PSWEEP_PROMPTS if p + 1 <= self.a.max_model_len]
        for n in prompts:  # warm each shape
            self.batch([self.spec(n, 1)])
        got: dict[str, list] = {}
        for _ in range(self.a.reps):
            for n in prompts:
                got.setdefault(str(n), []).append(self._ttft_sample(n))
            for n in (max(prompts),):  # the same prompt length as token ids: no tokenizer in the front end
                got.setdefault(f"{n}ids", []).append(self._ttft_sample(n, ids=True))
        out = []
        for k, v in got.items():
            out.append(
                {
                    "prompt": int(k.rstrip("ids")),
                    "as_ids": k.endswith("ids"),
                    "ttft_ms": statistics.median(x[0] for x in v),
                    "ttft_ms_all": [round(x[0], 2) for x in v],
                    "server_ttft_ms": statistics.median(x[1] for x in v),
                    "server_prefill_ms": statistics.median(x[2] for x in v),
                }
            )
            self.log(
                f"psweep {k}: {out[-1]['ttft_ms']:.2f} ms {out[-1]['ttft_ms_all']} server "
                f"{out[-1]['server_ttft_ms']:.1f} prefill {out[-1]['server_prefill_ms']:.1f}"
            )
        self.res["psweep"] = out

    def phase_dsweep(self) -> None:
        """Steady decode step by batch size across the CUDA-graph limit (128 seqs), repeated."""
        out = []
        for rep in range(self.a.reps_decode):
            for p, batches in ((128, DSWEEP_BATCHES), (1024, (1, 16, 32, 64))):
                for b in batches:
                    if p * b > self.a.dsweep_max_tokens:
                        continue
                    rs, d = self.batch([self.spec(p, self.a.dsweep_out) for _ in range(b)])
                    s = self._decode_summary(rs, d)
                    st = s["steady"] or {}
                    steps = d.get("vllm:iteration_tokens_total_count")
                    out.append(
                        {
                            "rep": rep,
                            "prompt": p,
                            "batch": b,
                            "out": self.a.dsweep_out,
                            "steady_step_ms": st.get("step_ms"),
                            "steady_ctx_mid": st.get("ctx_mid"),
                            "tpot_ms_p50": s["tpot_ms_p50"],
                            "makespan_s": s["makespan_s"],
                            "engine_steps": steps,
                            "server_itl_ms": 1e3
                            * self.scale
                            * d.get("vllm:inter_token_latency_seconds_sum", 0)
                            / max(1, d.get("vllm:inter_token_latency_seconds_count", 1)),
                            "chunks_per_token": s["chunks_per_token"],
                            "errors": s["errors"],
                        }
                    )
                    self.log(
                        f"dsweep rep{rep} p{p} b{b}: steady {st.get('step_ms', 0):.2f} ms, "
                        f"server itl {out[-1]['server_itl_ms']:.2f}, steps {steps}"
                    )
                    if self.late():
                        self.res["dsweep"] = out
                        return
        self.res["dsweep"] = out

    def _decode_summary(self, rs: list[dict], d: dict) -> dict:
        ok = [r for r in rs if not r["err"]]
        tp = [(r["e2e"] - r["ttft"]) / (r["n_out"] - 1) for r in ok if r.get("ttft") is not None and r["n_out"] > 1]
        tt = [r["ttft"] for r in ok if r.get("ttft") is not None]
        ntok = sum(r["n_out"] for r in ok)
        mk = max((r["end"] for r in ok), default=0) - min((r["t0"] for r in ok), default=0)
        st = steady_decode(ok)
        return {
            "n": len(rs),
            "errors": len(rs) - len(ok),
            "tpot_ms_p50": pct(tp, 0.5) and pct(tp, 0.5) * 1e3,
            "tpot_ms_mean": tp and statistics.mean(tp) * 1e3,
            "tpot_ms_p90": pct(tp, 0.9) and pct(tp, 0.9) * 1e3,
            "ttft_ms_p50": pct(tt, 0.5) and pct(tt, 0.5) * 1e3,
            "ttft_ms_max": tt and max(tt) * 1e3,
            "makespan_s": mk,
            "out_tok_s": ntok / mk if mk > 0 else None,
            "chunks_per_token": (
                sum(r.get("chunks", 0) for r in ok) / max(1, sum(len(r.get("times", [])) for r in ok))
            ),
            "steady": st,
            "metrics_delta": d,
        }

    def phase_tpot(self) -> None:
        out = []
        for p in TPOT_PROMPTS:
            for b in self.a.batches:
                if b > self.a.max_batch:
                    continue
                rs, d = self.batch([self.spec(p, self.a.tpot_out) for _ in range(b)])
                s = {"prompt": p, "batch": b, "out": self.a.tpot_out, **self._decode_summary(rs, d)}
                out.append(s)
                st = s["steady"] or {}
                self.log(
                    f"tpot prompt={p} batch={b}: p50 {s['tpot_ms_p50']:.2f} ms, "
                    f"steady {st.get('step_ms', 0):.2f} ms, "
                    f"{s['out_tok_s']:.0f} tok/s, chunks/token {s['chunks_per_token']:.2f}"
                )
                if self.late():
                    break
        self.res["tpot"] = out

    def phase_mix(self) -> None:
        """`mix_batch` decoding streams; prompts of the given lengths injected at 1/3 and 2/3 of their run."""
        b, dec_out = self.a.mix_batch, self.a.mix_out
        if dec_out <= 0:  # size the decode run from the measured steady step (~3 s of decoding)
            step = next(
                (
                    t["steady"]["step_ms"]
                    for t in self.res.get("tpot", [])
                    if t["batch"] == 32 and t["prompt"] == 256 and t.get("steady")
                ),
                6.0,
            )
            dec_out = int(min(1024, max(256, 3000 / step)))
        run_s = (
            dec_out
            * (
                next(
                    (
                        t["steady"]["step_ms"]
                        for t in self.res.get("tpot", [])
                        if t["batch"] == 32 and t["prompt"] == 256 and t.get("steady")
                    ),
                    6.0,
                )
            )
            / 1e3
        )
        specs = [self.spec(256, dec_out) for _ in range(b)]
        inj = []
        for i, L in enumerate(self.a.mix_inject):
            at = (
                self.a.mix_at[i] if i < len(self.a.mix_at) else round(run_s * (i + 1) / (len(self.a.mix_inject) + 1), 3)
            )
            sp = self.spec(L, 1, delay=at)
            inj.append((sp["id"], L, at))
            specs.append(sp)
        rs, d = self.batch(specs)
        byid = {r["id"]: r for r in rs}
        dec = [r for r in rs if r["out_req"] == dec_out and r.get("times")]
        res = {
            "batch": b,
            "decode_prompt": 256,
            "decode_out": dec_out,
            "inject": [],
            "metrics_delta": d,
            "errors": sum(1 for r in rs if r["err"]),
        }
        base = [
            statistics.median([t2 - t1 for t1, t2 in zip(r["times"][5:40], r["times"][6:41], strict=False)] or [0])
            for r in dec
        ]
        res["baseline_itl_ms"] = statistics.median(base) * 1e3 if base else None
        for iid, L, at in inj:
            r = byid[iid]
            if r["err"] or r.get("ttft") is None:
                res["inject"].append({"prompt": L, "at_s": at, "err": r["err"]})
                continue
            t_in, t_first = r["t0"], r["t0"] + r["ttft"]
            gaps, stall, ctx = [], [], []
            for x in dec:
                ts = x["times"]
                itl = [(ts[i] - ts[i - 1], ts[i], i) for i in range(1, len(ts)) if t_in < ts[i] <= t_first + 0.05]
                if itl:
                    g = max(itl)
                    gaps.append(g[0])
                    ctx.append(256 + g[2])
                    stall.append(sum(v for v, _, _ in itl) - len(itl) * (res["baseline_itl_ms"] or 0) / 1e3)
            res["inject"].append(
                {
                    "prompt": L,
                    "at_s": at,
                    "ttft_ms": r["ttft"] * 1e3,
                    "decoders_at_inject": sum(1 for x in dec if x["times"][0] < t_in < x["times"][-1]),
                    "max_gap_ms": statistics.median(gaps) * 1e3 if gaps else None,
                    "stall_ms": statistics.median(stall) * 1e3 if stall else None,
                    "ctx_at_gap": statistics.mean(ctx) if ctx else None,
                }
            )
            self.log(f"mix inject {L}: ttft {r['ttft'] * 1e3:.1f} ms, decoder gap {res['inject'][-1]['max_gap_ms']}")
        self.res["mix"] = res

    def phase_saturation(self) -> None:
        n, p, o = self.a.sat_streams, self.a.sat_prompt, self.a.sat_out
        out = {}
        modes = ("nonstream", "stream") if self.a.sat_stream else ("nonstream",)
        for mode in modes:
            rs, d = self.batch([self.spec(p, o, stream=(mode == "stream")) for _ in range(n)])
            ok = [r for r in rs if not r["err"]]
            mk = max((r["end"] for r in ok), default=0) - min((r["t0"] for r in ok), default=0)
            e2e = [r["e2e"] for r in ok]
            s = {
                "streams": n,
                "prompt": p,
                "out": o,
                "errors": len(rs) - len(ok),
                "makespan_s": mk,
                "out_tok_s": sum(r["n_out"] for r in ok) / mk if mk > 0 else None,
                "e2e_s_p50": pct(e2e, 0.5),
                "e2e_s_p99": pct(e2e, 0.99),
                "metrics_delta": d,
            }
            if mode == "stream":
                s.update({k: v for k, v in self._decode_summary(rs, d).items() if k not in ("metrics_delta",)})
            out[mode] = s
            self.log(f"saturation {mode}: {s['out_tok_s']:.0f} out tok/s, makespan {mk:.2f} s")
            if self.late():
                break
        self.res["saturation"] = out

    def phase_kv(self) -> None:
        text, _ = self.metrics()
        kv = self.a.kv_tokens
        cc = labels_of(text, "vllm:cache_config_info")
        if not kv and cc.get("num_gpu_blocks"):
            kv = int(cc["num_gpu_blocks"]) * int(cc.get("block_size", 16))
        if not kv:
            self.log("kv: unknown KV budget (pass --kv-tokens); skipped")
            return
        p, o = self.a.kv_prompt, self.a.kv_out
        n = self.a.kv_n or math.ceil(self.a.kv_factor * kv / (p + o))
        polls: list[list[float]] = []
        stop = threading.Event()

        def poll() -> None:
            c = httpx.Client(timeout=5)
            t0 = time.perf_counter()
            while not stop.is_set():
                try:
                    m = parse_metrics(c.get(self.url + "/metrics").text)
                    polls.append(
                        [
                            round((time.perf_counter() - t0) * self.scale, 3),
                            m.get("vllm:num_requests_running", -1),
                            m.get("vllm:num_requests_waiting", -1),
                            round(m.get("vllm:kv_cache_usage_perc", m.get("vllm:gpu_cache_usage_perc", -1)), 4),
                            m.get("vllm:num_preemptions_total", -1),
                        ]
                    )
                except Exception:
                    pass
                stop.wait(self.a.poll_s)

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        rs, d = self.batch([self.spec(p, o, stream=False) for _ in range(n)])
        stop.set()
        th.join()
        ok = [r for r in rs if not r["err"]]
        e2e = [r["e2e"] for r in ok]
        mk = max((r["end"] for r in ok), default=0) - min((r["t0"] for r in ok), default=0)
        res = {
            "kv_tokens": kv,
            "requests": n,
            "prompt": p,
            "out": o,
            "need_over_budget": n * (p + o) / kv,
            "errors": len(rs) - len(ok),
            "makespan_s": mk,
            "e2e_s_p50": pct(e2e, 0.5),
            "e2e_s_p90": pct(e2e, 0.9),
            "e2e_s_p99": pct(e2e, 0.99),
            "e2e_s_min": min(e2e, default=None),
            "out_tok_s": sum(r["n_out"] for r in ok) / mk if mk > 0 else None,
            "preemptions": d.get("vllm:num_preemptions_total"),
            "max_running": max((x[1] for x in polls), default=None),
            "max_waiting": max((x[2] for x in polls), default=None),
            "waiting_seen": any(x[2] > 0 for x in polls),
            "frac_polls_waiting": (sum(1 for x in polls if x[2] > 0) / len(polls)) if polls else None,
            "max_kv_usage": max((x[3] for x in polls), default=None),
            "polls": polls[:: max(1, len(polls) // 300)],
            "metrics_delta": d,
            "cache_config": cc,
        }
        self.res["kv"] = res
        self.log(
            f"kv: {n} x ({p}+{o}) on {kv} tokens: makespan {mk:.2f} s, e2e p50 {res['e2e_s_p50']:.2f} "
            f"p99 {res['e2e_s_p99']:.2f} s, preemptions {res['preemptions']}, max waiting {res['max_waiting']}"
        )

    def run(self) -> None:
        text, _ = self.metrics()
        self.res["meta"]["metric_names"] = sorted(
            {re.split(r"[{ ]", ln)[0] for ln in text.splitlines() if ln.startswith("vllm:")}
        )
        self.res["meta"]["cache_config"] = labels_of(text, "vllm:cache_config_info")
        t0 = time.time()
        self.warmup()
        self.save()
        for ph in self.a.phases:
            if self.late():
                self.log(f"deadline passed, skipping {ph}")
                self.res.setdefault("skipped", []).append(ph)
                continue
            t = time.time()
            getattr(self, f"phase_{ph}")()
            self.res["meta"][f"wall_{ph}_s"] = round(time.time() - t, 1)
            self.save()
        self.res["meta"]["wall_s"] = round(time.time() - t0, 1)
        self.save()
        if self.pool:
            self.pool.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--phases",
        default="ttft,tpot,mix,saturation",
        help=f"comma list of {','.join(PHASES)} (kv only makes sense on a small-KV server)",
    )
    ap.add_argument(
        "--procs",
        type=int,
        default=max(1, min(8, (os.cpu_count() or 2) // 2)),
        help="client processes the streams are spread over",
    )
    ap.add_argument("--speedup", type=float, default=1.0, help="the server's time speedup; times are scaled back")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="brief's prompt lengths only, short warm-up")
    ap.add_argument("--deadline", type=float, default=0, help="epoch seconds after which phases are skipped")
    ap.add_argument("--request-timeout", type=float, default=300)
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--tpot-out", type=int, default=128)
    ap.add_argument("--batches", default=",".join(map(str, TPOT_BATCHES)), help="tpot batch sizes")
    ap.add_argument("--mix-batch", type=int, default=32)
    ap.add_argument("--mix-out", type=int, default=0, help="decode length of the mix streams (0: ~3 s of decode)")
    ap.add_argument("--mix-inject", default="2048,8192")
    ap.add_argument("--mix-at", default="", help="injection times in s after the batch start (default: 1/3, 2/3)")
    ap.add_argument("--sat-streams", type=int, default=256)
    ap.add_argument("--sat-prompt", type=int, default=128)
    ap.add_argument("--sat-out", type=int, default=256)
    ap.add_argument("--sat-stream", type=int, default=1, help="also run the saturation probe streaming (1/0)")
    ap.add_argument("--kv-tokens", type=int, default=0, help="KV budget (default: from vllm:cache_config_info)")
    ap.add_argument("--kv-factor", type=float, default=4.0)
    ap.add_argument("--kv-n", type=int, default=0)
    ap.add_argument("--kv-prompt", type=int, default=1024)
    ap.add_argument("--kv-out", type=int, default=1024)
    ap.add_argument("--poll-s", type=float, default=0.1)
    ap.add_argument("--reps", type=int, default=3, help="psweep repetitions")
    ap.add_argument("--ttft-reps", type=int, default=3, help="measured requests per prompt length (median)")
    ap.add_argument("--reps-decode", type=int, default=2, help="dsweep repetitions")
    ap.add_argument("--dsweep-out", type=int, default=64)
    ap.add_argument("--dsweep-max-tokens", type=int, default=70000, help="skip dsweep batches with more prompt tokens")
    a = ap.parse_args(argv)
    a.phases = [p for p in a.phases.split(",") if p]
    bad = [p for p in a.phases if p not in PHASES]
    if bad:
        ap.error(f"unknown phase(s) {bad}")
    a.mix_inject = [int(x) for x in a.mix_inject.split(",") if x]
    a.mix_at = [float(x) for x in a.mix_at.split(",") if x]
    a.batches = [int(x) for x in a.batches.split(",") if x]
    Probe(a).run()


if __name__ == "__main__":
    main()
