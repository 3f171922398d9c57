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
import statistics
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


# The extended model (raw.extended_fit of each profile), patched into the simulator for the "sim ext" column only:
# a step of more than GRAPH_MAX scheduled tokens runs without CUDA graphs and costs `eager` more, and the front
# end is a serial server that spends FE_SERIAL + PER_TOKEN * prompt_len on each request before the engine sees it.
EXT_PATCH = """
import asyncio
from backends.sim import engine as _e
_EAGER, _PER_TOKEN, _FE_SERIAL, _GRAPH_MAX = %r, %r, %r, 128
_schedule = _e.Engine.schedule
def schedule(self, now):
    b = _schedule(self, now)
    if b.requests and sum(b.num_new) > _GRAPH_MAX:
        b.duration += _EAGER / self.speedup
    return b
def submit(self, req):
    # vLLM's API server handles requests one after another: a FIFO server of FE_SERIAL + PER_TOKEN * prompt
    # seconds per request, then the rest of the constant TTFT overhead in parallel
    loop = asyncio.get_running_loop()
    now = loop.time()
    free = max(now, getattr(self, "_fe_free", 0.0)) + (_FE_SERIAL + _PER_TOKEN * req.prompt_len) / self.speedup
    self._fe_free = free
    loop.call_later(free - now + self._ttft_overhead, self.enqueue, req)
_e.Engine.schedule, _e.Engine.submit = schedule, submit
"""


def ext_profile(prof_path: Path, out: Path, sim_http_s: float) -> tuple[Path, tuple[float, float, float]]:
    """A copy of the profile carrying the extended fit's coefficients; returns it and the patch's constants."""
    prof = json.loads(prof_path.read_text())
    if "extended_fit" not in prof.get("raw", {}):
        raise SystemExit(
            f"{prof_path}: no raw.extended_fit (the simulator models the eager step and the serial "
            "front end itself since the cudagraph/frontend_s profile sections; --extended is obsolete)"
        )
    c = prof["raw"]["extended_fit"]["coef"]
    fe = c.get("frontend_serial_s_per_request", 0.0)
    prof["step_time_s"] = {k: c[k] for k in prof["step_time_s"]}
    prof["overhead_s"] = {"ttft": max(0.0, c["ovh_ttft"] - fe - sim_http_s)}
    p = out / f"ext-{prof_path.name}"
    p.write_text(json.dumps(prof))
    return p, (c["eager_step"], c["ttft_per_prompt_token"], fe)


def start_sim(
    profile: str, port: int, kv_tokens: int | None, speedup: float, ext: tuple[float, float, float] | None = None
) -> subprocess.Popen:
    patch = EXT_PATCH.replace("%r, %r, %r", ", ".join(map(repr, ext))) if ext else ""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{patch}"
        "from backends.sim.server import serve, SimSettings\n"
        f"serve(SimSettings(profile={profile!r}, kv_tokens={kv_tokens!r}, speedup={speedup!r}), "
        f"'127.0.0.1', {port})\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
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
    cmd = [
        sys.executable,
        str(HERE / "probe.py"),
        "--url",
        f"http://127.0.0.1:{port}",
        "--model",
        model,
        "--out",
        str(out),
        "--speedup",
        str(speedup),
        *args,
    ]
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


def run_model(model: str, a: argparse.Namespace, port: int, ext: bool = False) -> None:
    real = json.loads((DATA / f"probe-{model}.json").read_text())
    prof_path = Path(a.profiles) / f"h200-{model}.json"
    prof = json.loads(prof_path.read_text())
    s = a.speedup or auto_speedup(prof, a.chunks_per_s)
    mix = real.get("mix") or {}
    out = Path(a.out_dir)
    tag, patch = "", None
    if ext:
        prof_path, patch = ext_profile(prof_path, out, a.sim_http_ms / 1e3)
        tag = "-ext"
    # TTFT at batch 1: real time (one stream)
    p = start_sim(str(prof_path), port, None, 1.0, patch)
    try:
        d1 = probe(
            port,
            model,
            out / f"sim{tag}-{model}-ttft.json",
            1.0,
            ["--phases", "ttft", "--quick", "--procs", "1", "--ttft-reps", str(a.ttft_reps)],
        )
    finally:
        stop_sim(p)
    print(f"  sim lag (ttft, speedup 1): {lag(d1)}")
    # load probes: slowed down
    p = start_sim(str(prof_path), port, None, s, patch)
    try:
        args = [
            "--phases",
            "tpot,mix,saturation",
            "--quick",
            "--procs",
            str(a.procs),
            "--sat-stream",
            "0",
            "--mix-out",
            str(mix.get("decode_out", 0)),
            "--mix-at",
            ",".join(str(i["at_s"]) for i in mix.get("inject", [])),
            "--mix-inject",
            ",".join(str(i["prompt"]) for i in mix.get("inject", [])),
        ]
        d2 = probe(port, model, out / f"sim{tag}-{model}-load.json", s, args)
    finally:
        stop_sim(p)
    print(f"  sim lag (load, speedup {s}): {lag(d2)}")


def run_kv(a: argparse.Namespace, port: int, ext: bool = False) -> None:
    real = json.loads((DATA / "probe-kvsmall.json").read_text())["kv"]
    prof_path = Path(a.profiles) / "h200-qwen2.5-0.5b.json"
    s = a.kv_speedup
    tag, patch = "", None
    if ext:
        prof_path, patch = ext_profile(prof_path, Path(a.out_dir), a.sim_http_ms / 1e3)
        tag = "-ext"
    p = start_sim(str(prof_path), port, real["kv_tokens"], s, patch)
    try:
        d = probe(
            port,
            "qwen2.5-0.5b",
            Path(a.out_dir) / f"sim{tag}-kvsmall.json",
            s,
            [
                "--phases",
                "kv",
                "--quick",
                "--procs",
                str(a.procs),
                "--kv-tokens",
                str(real["kv_tokens"]),
                "--kv-n",
                str(real["requests"]),
                "--kv-prompt",
                str(real["prompt"]),
                "--kv-out",
                str(real["out"]),
            ],
        )
    finally:
        stop_sim(p)
    print(f"  sim lag (kv, speedup {s}): {lag(d)}")


# ----------------------------------------------------------------------------------------------------------


def cell(rows: list, model: str, name: str, real: list, sims: list, unit: str) -> None:
    """real: the measured values of each boot that measured the cell (their median is the reference: with two, their
    mean); sims: [plain sim, extended sim]."""
    real = [r for r in real if r is not None and r == r]
    ref = statistics.median(real) if real else None
    row = {
        "model": model,
        "cell": name,
        "unit": unit,
        "real": ref,
        "real_runs": real,
        "run_spread": (max(real) / min(real) - 1) if len(real) > 1 and min(real) > 0 else None,
    }
    for key, v in zip(("sim", "sim_ext"), sims, strict=True):
        row[key] = v
        row[key + "_err"] = (v / ref - 1) if (ref and v is not None) else None
    rows.append(row)


def _load(p: Path) -> dict:
    return json.loads(p.read_text()) if p.exists() else {}


def table(a: argparse.Namespace) -> list[dict]:
    out = Path(a.out_dir)
    rows: list[dict] = []
    for model in a.models:
        if a.boot:  # one boot alone as the reference (e.g. one that no fit has seen)
            real, real2, sweeps, again = _load(DATA / f"{a.boot}-{model}.json"), {}, [], []
        else:
            real = _load(DATA / f"probe-{model}.json")
            real2 = _load(DATA / f"probe2-{model}.json")
            # later boots: of run 2's sweeps (probe3-*.json: TTFT) and of run 1's probes (boot<N>-probe-*.json)
            sweeps = [_load(f) for f in sorted(DATA.glob(f"probe[3-9]-{model}.json"))] if a.repeats else []
            again = [_load(f) for f in sorted(DATA.glob(f"boot[0-9]*-probe-{model}.json"))] if a.repeats else []
        firsts = [real, *again]  # every boot of run 1's probes
        s1, s2 = (
            [_load(out / f"sim{t}-{model}-ttft.json") for t in ("", "-ext")],
            [_load(out / f"sim{t}-{model}-load.json") for t in ("", "-ext")],
        )
        rts = [{t["prompt"]: t["ttft_ms"] for t in d.get("ttft", [])} for d in firsts] + [
            {t["prompt"]: t["ttft_ms"] for t in d.get("psweep", []) if not t.get("as_ids")} for d in (real2, *sweeps)
        ]
        for n in TTFT_CELLS:
            cell(
                rows,
                model,
                f"TTFT p{n}",
                [rt.get(n) for rt in rts],
                [{t["prompt"]: t["ttft_ms"] for t in s.get("ttft", [])}.get(n) for s in s1],
                "ms",
            )
        rps = [{(t["prompt"], t["batch"]): t for t in d.get("tpot", [])} for d in firsts]
        for k in sorted(rps[0]):
            cell(
                rows,
                model,
                f"TPOT p{k[0]} b{k[1]}",
                [(rp.get(k) or {}).get("tpot_ms_p50") for rp in rps],
                [
                    ({(t["prompt"], t["batch"]): t for t in s.get("tpot", [])}.get(k) or {}).get("tpot_ms_p50")
                    for s in s2
                ],
                "ms",
            )
        rss = [(d.get("saturation") or {}).get("nonstream") or {} for d in firsts]
        ss = [(s.get("saturation") or {}).get("nonstream") or {} for s in s2]
        cell(
            rows,
            model,
            f"saturation {rss[0].get('streams')}x out tok/s",
            [rs.get("out_tok_s") for rs in rss],
            [x.get("out_tok_s") for x in ss],
            "tok/s",
        )
        cell(
            rows,
            model,
            "saturation makespan",
            [rs.get("makespan_s") for rs in rss],
            [x.get("makespan_s") for x in ss],
            "s",
        )
        rm = real.get("mix") or {}
        for i, ri in enumerate(rm.get("inject", [])):
            sims = []
            for s in s2:
                inj = (s.get("mix") or {}).get("inject", [])
                sims.append(inj[i].get("ttft_ms") if i < len(inj) else None)
            injects = [(d.get("mix") or {}).get("inject") or [] for d in firsts]  # each boot's i-th, same prompt
            vals = [inj[i].get("ttft_ms") for inj in injects if i < len(inj) and inj[i].get("prompt") == ri["prompt"]]
            cell(rows, model, f"mix TTFT of p{ri['prompt']} into b{rm['batch']}", vals, sims, "ms")
    kvs = [_load(DATA / f"{a.boot or 'probe'}-kvsmall.json").get("kv")]
    if a.repeats and not a.boot:
        kvs += [_load(f).get("kv") for f in sorted(DATA.glob("boot[0-9]*-probe-kvsmall.json"))]
    kvs = [k for k in kvs if k]
    r = kvs[0] if kvs else None
    sk = [_load(out / f"sim{t}-kvsmall.json").get("kv", {}) for t in ("", "-ext")]
    if r and any(sk):
        m = f"qwen2.5-0.5b kv={r['kv_tokens']}"
        for k, name, unit in (
            ("e2e_s_p50", "KV pressure e2e p50", "s"),
            ("e2e_s_p99", "KV pressure e2e p99", "s"),
            ("makespan_s", "KV pressure makespan", "s"),
            ("preemptions", "KV pressure preemptions", "#"),
            ("max_running", "KV pressure max running", "#"),
            ("max_waiting", "KV pressure max waiting", "#"),
        ):
            cell(rows, m, name, [kv.get(k) for kv in kvs], [x.get(k) for x in sk], unit)
    return rows


def render(rows: list[dict]) -> str:
    def f(v: float | None) -> str:
        return "-" if v is None else (f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}")

    def e(v: float | None) -> str:
        return "-" if v is None else f"{v:+.0%}" + (" ✗" if abs(v) > 0.10 else "")

    ext = any(r["sim_ext"] is not None for r in rows)
    second = "before" if any(r.get("baseline") for r in rows) else "sim ext"
    head = "| model | cell | real | run spread | sim | rel. err |" + (f" {second} | rel. err |" if ext else "")
    lines = [head, "|---|---|---:|---:|---:|---:|" + ("---:|---:|" if ext else "")]
    for r in rows:
        sp = "-" if r["run_spread"] is None else f"{r['run_spread']:.0%}"
        line = (
            f"| {r['model']} | {r['cell']} ({r['unit']}) | {f(r['real'])} | {sp} | {f(r['sim'])} | {e(r['sim_err'])} |"
        )
        if ext:
            line += f" {f(r['sim_ext'])} | {e(r['sim_ext_err'])} |"
        lines.append(line)
    lines.append("")
    names = (
        ("sim_err", "sim (shipped profiles)"),
        ("sim_ext_err", "before (baseline)" if second == "before" else "sim + extended model"),
    )
    for key, name in names:
        ok = [r for r in rows if r[key] is not None]
        if ok:
            within = sum(1 for r in ok if abs(r[key]) <= 0.10)
            lines.append(
                f"{name}: {within}/{len(ok)} cells within 10%, median |err| "
                f"{sorted(abs(r[key]) for r in ok)[len(ok) // 2]:.0%}."
            )
    lines += reproducibility(rows)
    return "\n".join(lines)


def reproducibility(rows: list[dict]) -> list[str]:
    """How well real vLLM reproduces itself, on the cells that three or more boots measured: each boot against the
    median of the others (what the sim's 10 % is measured against), and the sim on the cells whose boots agree."""
    many = [r for r in rows if len(r.get("real_runs") or ()) >= 3]
    if not many:
        return []
    pairs = [
        abs(v / statistics.median(r["real_runs"][:i] + r["real_runs"][i + 1 :]) - 1) <= 0.10
        for r in many
        for i, v in enumerate(r["real_runs"])
    ]
    tight = [r for r in many if max(abs(v / r["real"] - 1) for v in r["real_runs"]) <= 0.10]
    sim_ok = sum(1 for r in tight if r["sim_err"] is not None and abs(r["sim_err"]) <= 0.10)
    return [
        f"real vs real ({len(many)} cells of 3+ boots): a boot within 10% of the other boots' median in "
        f"{sum(pairs)}/{len(pairs)} cases ({sum(pairs) / len(pairs):.0%}).",
        f"cells whose boots all lie within 10% of their median: {len(tight)}; the sim within 10% on {sim_ok} of them.",
    ]


def against_boot(a: argparse.Namespace) -> list[str]:
    """With ``--boot``: how close the other boots of run 1's probes come to that boot, each alone and their median
    (what a sim fitted to them could hope for on it)."""
    others = ["probe", *sorted({f.name.split("-qwen", 1)[0] for f in DATA.glob("boot[0-9]*-probe-qwen*.json")})]
    others = [b for b in others if b != a.boot]
    real = {b: {(r["model"], r["cell"]): r["real"] for r in table(argparse.Namespace(**{**vars(a), "boot": b}))}
            for b in [a.boot, *others]}  # fmt: skip
    ref = {k: v for k, v in real[a.boot].items() if v}

    def within(vals: dict) -> str:
        ok = [abs(vals[k] / v - 1) <= 0.10 for k, v in ref.items() if vals.get(k)]
        return f"{sum(ok)}/{len(ok)}"

    median = {k: statistics.median([real[b][k] for b in others if real[b].get(k) is not None]) for k in ref}
    each = ", ".join(f"{b} {within(real[b])}" for b in others)
    return [f"real against {a.boot}: the other boots' median within 10% on {within(median)} cells; each alone: {each}."]


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
    ap.add_argument(
        "--no-repeats",
        dest="repeats",
        action="store_false",
        help="the reference of 2026-11-29/30: run 1 (and run 2's TTFTs) only, not the later boots of the same probes",
    )
    ap.add_argument(
        "--boot",
        default="",
        help="one boot alone as the reference: the prefix of its files in data/ (probe: run 1; boot5-probe: ...)",
    )
    ap.add_argument("--ttft-reps", type=int, default=7, help="sim TTFT samples per prompt (this box is noisy)")
    ap.add_argument(
        "--variants", default="", help="plain,ext: which sims to run (default: plain, and ext with --extended)"
    )
    ap.add_argument(
        "--extended",
        action="store_true",
        help="also run the sim patched with each profile's raw.extended_fit (eager steps, per-token TTFT)",
    )
    ap.add_argument("--sim-http-ms", type=float, default=3.0, help="as in fit_profile.py, for the extended profiles")
    ap.add_argument("--write", default=str(DATA / "fidelity"), help="writes <this>.json and <this>.md")
    ap.add_argument(
        "--baseline",
        default="",
        help="a previous fidelity .json: its sim column is shown as 'before' (instead of sim ext)",
    )
    a = ap.parse_args()
    a.models = [m for m in a.models.split(",") if m]
    Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    if not a.table_only:
        variants = [v for v in (a.variants or ("plain,ext" if a.extended else "plain")).split(",") if v]
        for ext in [v == "ext" for v in variants]:
            for i, m in enumerate(a.models):
                print(f"== {m}{' (extended model)' if ext else ''}", flush=True)
                run_model(m, a, a.port + i, ext)
            if not a.no_kv:
                print("== KV pressure (qwen2.5-0.5b, small KV)", flush=True)
                run_kv(a, a.port + 9, ext)
    rows = table(a)
    if a.baseline:
        old = {(r["model"], r["cell"]): r.get("sim") for r in json.loads(Path(a.baseline).read_text())}
        for r in rows:
            v = old.get((r["model"], r["cell"]))
            r["sim_ext"], r["baseline"] = v, True
            r["sim_ext_err"] = (v / r["real"] - 1) if (v is not None and r["real"]) else None
    md = render(rows)
    if a.boot:
        md += "\n" + "\n".join(against_boot(a))
    print(md)
    if a.write:
        Path(a.write + ".json").write_text(json.dumps(rows, indent=1) + "\n")
        Path(a.write + ".md").write_text(md + "\n")
        print(f"wrote {a.write}.json / .md")


if __name__ == "__main__":
    main()
