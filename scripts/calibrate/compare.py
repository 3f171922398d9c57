#!/usr/bin/env python3
"""Sim-vs-real fidelity: run scripts/calibrate/probe.py against the simulated worker with each measured profile
and tabulate it against the real vLLM 0.26.0 / H200 results in scripts/calibrate/data/.

Cells: TTFT by prompt length (batch 1), TPOT (vllm bench definition, p50) by batch at prompts 256 and 2048,
output tokens/s and makespan at saturation (256 streams, non-streaming), and the KV-pressure probe on the
small-KV 0.5B worker (same KV tokens): e2e p50/p99, makespan. Relative error = sim / real - 1.

This machine has 2 cores: a real-time sim cannot stream 128 concurrent SSE streams at a few ms per token, so
the load probes (TPOT, saturation, KV) run the sim slowed down (``--speedup`` < 1; probe.py scales the times
back) by a factor chosen from the profile so that about ``--chunks-per-s`` SSE chunks per second are produced.
The sim's own step lag (sim:engine_step_lag_seconds) is reported per run.

    python scripts/calibrate/compare.py                       # all models + KV pressure (~10 min)
    python scripts/calibrate/compare.py --models qwen2.5-7b   # one model
    python scripts/calibrate/compare.py --table-only          # re-tabulate the last sim runs
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DATA = HERE / "data"
MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b")
TTFT_CELLS = (128, 512, 2048, 8192)


def start_sim(profile: str, port: int, kv_tokens: int | None, speedup: float) -> subprocess.Popen:
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from backends.sim.server import serve, SimSettings\n"
            "serve(SimSettings(profile=%r, kv_tokens=%r, speedup=%r), '127.0.0.1', %d)\n"
            % (str(ROOT), profile, kv_tokens, speedup, port))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    t0 = time.time()
    while time.time() - t0 < 30:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return p
        except httpx.HTTPError:
            pass
        if p.poll() is not None:
            raise RuntimeError(f"sim exited: {p.stderr.read().decode()[-2000:] if p.stderr else ''}")
        time.sleep(0.3)
    p.kill()
    raise RuntimeError("sim did not become healthy in 30 s")


def stop_sim(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, 15)
    except ProcessLookupError:
        return
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)


def probe(port: int, model: str, out: Path, speedup: float, args: list[str]) -> dict:
    cmd = [sys.executable, str(HERE / "probe.py"), "--url", f"http://127.0.0.1:{port}", "--model", model,
           "--out", str(out), "--speedup", str(speedup), *args]
    print("  $", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def auto_speedup(profile: dict, target_chunks_per_s: float, batch: int = 128) -> float:
    c = profile["step_time_s"]
    step = c["base"] + c["decode_seqs"] * batch + c.get("decode_context_tokens", 0) * batch * 1000
    s = target_chunks_per_s * step / batch
    return float(f"{min(1.0, max(0.05, s)):.2g}")


def lag(d: dict) -> str:
    """Mean engine-step lag of the sim over a result's batches, in sim milliseconds."""
    tot = n = 0.0

    def walk(x: object) -> None:
        nonlocal tot, n
        if isinstance(x, dict):
            md = x.get("metrics_delta")
            if isinstance(md, dict):
                tot += md.get("sim:engine_step_lag_seconds_sum", 0)
                n += md.get("sim:engine_step_lag_seconds_count", 0)
            for k, v in x.items():
                if k != "metrics_delta":
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(d)
    return f"{tot / n * 1e3:.2f} ms over {int(n)} steps" if n else "n/a"


def run_model(model: str, a: argparse.Namespace, port: int) -> None:
    real = json.loads((DATA / f"probe-{model}.json").read_text())
    prof_path = Path(a.profiles) / f"h200-{model}.json"
    prof = json.loads(prof_path.read_text())
    s = a.speedup or auto_speedup(prof, a.chunks_per_s)
    mix = real.get("mix") or {}
    out = Path(a.out_dir)
    # TTFT at batch 1: real time (one stream)
    p = start_sim(str(prof_path), port, None, 1.0)
    try:
        d1 = probe(port, model, out / f"sim-{model}-ttft.json", 1.0, ["--phases", "ttft", "--quick", "--procs", "1"])
    finally:
        stop_sim(p)
    print(f"  sim lag (ttft, speedup 1): {lag(d1)}")
    # load probes: slowed down
    p = start_sim(str(prof_path), port, None, s)
    try:
        args = ["--phases", "tpot,mix,saturation", "--quick", "--procs", str(a.procs), "--sat-stream", "0",
                "--mix-out", str(mix.get("decode_out", 0)),
                "--mix-at", ",".join(str(i["at_s"]) for i in mix.get("inject", [])),
                "--mix-inject", ",".join(str(i["prompt"]) for i in mix.get("inject", []))]
        d2 = probe(port, model, out / f"sim-{model}-load.json", s, args)
    finally:
        stop_sim(p)
    print(f"  sim lag (load, speedup {s}): {lag(d2)}")


def run_kv(a: argparse.Namespace, port: int) -> None:
    real = json.loads((DATA / "probe-kvsmall.json").read_text())["kv"]
    prof_path = Path(a.profiles) / "h200-qwen2.5-0.5b.json"
    s = a.kv_speedup
    p = start_sim(str(prof_path), port, real["kv_tokens"], s)
    try:
        d = probe(port, "qwen2.5-0.5b", Path(a.out_dir) / "sim-kvsmall.json", s,
                  ["--phases", "kv", "--quick", "--procs", str(a.procs), "--kv-tokens", str(real["kv_tokens"]),
                   "--kv-n", str(real["requests"]), "--kv-prompt", str(real["prompt"]), "--kv-out", str(real["out"])])
    finally:
        stop_sim(p)
    print(f"  sim lag (kv, speedup {s}): {lag(d)}")


# ----------------------------------------------------------------------------------------------------------


def cell(rows: list, model: str, name: str, real: float | None, sim: float | None, unit: str) -> None:
    err = (sim / real - 1) if (real and sim is not None) else None
    rows.append({"model": model, "cell": name, "unit": unit, "real": real, "sim": sim, "rel_err": err})


def table(a: argparse.Namespace) -> list[dict]:
    out = Path(a.out_dir)
    rows: list[dict] = []
    for model in a.models:
        real = json.loads((DATA / f"probe-{model}.json").read_text())
        f1, f2 = out / f"sim-{model}-ttft.json", out / f"sim-{model}-load.json"
        s1 = json.loads(f1.read_text()) if f1.exists() else {}
        s2 = json.loads(f2.read_text()) if f2.exists() else {}
        rt = {t["prompt"]: t["ttft_ms"] for t in real.get("ttft", [])}
        st = {t["prompt"]: t["ttft_ms"] for t in s1.get("ttft", [])}
        for n in TTFT_CELLS:
            cell(rows, model, f"TTFT p{n}", rt.get(n), st.get(n), "ms")
        rp = {(t["prompt"], t["batch"]): t for t in real.get("tpot", [])}
        sp = {(t["prompt"], t["batch"]): t for t in s2.get("tpot", [])}
        for k in sorted(rp):
            cell(rows, model, f"TPOT p{k[0]} b{k[1]}", rp[k]["tpot_ms_p50"], (sp.get(k) or {}).get("tpot_ms_p50"), "ms")
        rs = (real.get("saturation") or {}).get("nonstream") or {}
        ss = (s2.get("saturation") or {}).get("nonstream") or {}
        cell(rows, model, f"saturation {rs.get('streams')}x out tok/s", rs.get("out_tok_s"), ss.get("out_tok_s"), "tok/s")
        cell(rows, model, "saturation makespan", rs.get("makespan_s"), ss.get("makespan_s"), "s")
        rm, sm = real.get("mix") or {}, s2.get("mix") or {}
        for ri, si in zip(rm.get("inject", []), sm.get("inject", []), strict=False):
            cell(rows, model, f"mix TTFT of p{ri['prompt']} into b{rm['batch']}", ri.get("ttft_ms"), si.get("ttft_ms"), "ms")
    fk = out / "sim-kvsmall.json"
    if fk.exists() and (DATA / "probe-kvsmall.json").exists():
        r = json.loads((DATA / "probe-kvsmall.json").read_text())["kv"]
        s = json.loads(fk.read_text()).get("kv", {})
        m = f"qwen2.5-0.5b kv={r['kv_tokens']}"
        for k, name, unit in (("e2e_s_p50", "KV pressure e2e p50", "s"), ("e2e_s_p99", "KV pressure e2e p99", "s"),
                              ("makespan_s", "KV pressure makespan", "s"), ("preemptions", "KV pressure preemptions", "#"),
                              ("max_running", "KV pressure max running", "#"),
                              ("max_waiting", "KV pressure max waiting", "#")):
            cell(rows, m, name, r.get(k), s.get(k), unit)
    return rows


def render(rows: list[dict]) -> str:
    lines = ["| model | cell | real | sim | rel. err |", "|---|---|---:|---:|---:|"]
    for r in rows:
        f = (lambda v: "–" if v is None else (f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"))  # noqa: E731
        e = "–" if r["rel_err"] is None else f"{r['rel_err']:+.0%}" + (" ✗" if abs(r["rel_err"]) > 0.10 else "")
        lines.append(f"| {r['model']} | {r['cell']} ({r['unit']}) | {f(r['real'])} | {f(r['sim'])} | {e} |")
    ok = [r for r in rows if r["rel_err"] is not None]
    within = sum(1 for r in ok if abs(r["rel_err"]) <= 0.10)
    lines.append("")
    lines.append(f"{within}/{len(ok)} cells within 10%.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--profiles", default=str(ROOT / "backends" / "sim" / "profiles"))
    ap.add_argument("--out-dir", default="/tmp/chimera-fidelity", help="where the sim's probe results go")
    ap.add_argument("--speedup", type=float, default=0, help="sim speedup for the load probes (0: auto)")
    ap.add_argument("--chunks-per-s", type=float, default=4000, help="auto speedup target (SSE chunks/s)")
    ap.add_argument("--kv-speedup", type=float, default=0.5)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--port", type=int, default=18400)
    ap.add_argument("--no-kv", action="store_true")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--write", default=str(DATA / "fidelity"), help="writes <this>.json and <this>.md")
    a = ap.parse_args()
    a.models = [m for m in a.models.split(",") if m]
    Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    if not a.table_only:
        for i, m in enumerate(a.models):
            print(f"== {m}", flush=True)
            run_model(m, a, a.port + i)
        if not a.no_kv:
            print("== KV pressure (qwen2.5-0.5b, small KV)", flush=True)
            run_kv(a, a.port + 9)
    rows = table(a)
    md = render(rows)
    print(md)
    if a.write:
        Path(a.write + ".json").write_text(json.dumps(rows, indent=1) + "\n")
        Path(a.write + ".md").write_text(md + "\n")
        print(f"wrote {a.write}.json / .md")


if __name__ == "__main__":
    main()
