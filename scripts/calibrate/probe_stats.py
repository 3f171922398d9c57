"""What `probe.py` reads off a server and its own timings: vLLM's /metrics text, deltas, percentiles, the
steady decode step. Standard library only (it runs on the lent GPU machine's bare Python too)."""

from __future__ import annotations

import math
import re
import statistics

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """vllm:* samples summed over label sets, except histogram buckets, which keep their ``le``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(("vllm:", "sim:")):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, val = m.group(1), m.group(2) or "", m.group(3)
        try:
            v = float(val)
        except ValueError:
            continue
        if name.endswith("_bucket"):
            le = re.search(r'le="([^"]*)"', labels)
            name = f"{name}[{le.group(1) if le else ''}]"
        out[name] = out.get(name, 0.0) + v
    return out


KEEP_BUCKETS = ("vllm:iteration_tokens_total_bucket",)


def metric_delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    d = {}
    for k, v in b.items():
        base = k.split("[")[0]
        if "[" in k and base not in KEEP_BUCKETS:
            continue
        if not (base.endswith(("_total", "_sum", "_count", "_bucket"))):
            continue
        dv = v - a.get(k, 0.0)
        if dv:
            d[k] = round(dv, 6)
    return d


def labels_of(text: str, name: str) -> dict[str, str]:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
    return {}


# ----------------------------------------------------------------------------------------------------------
# statistics


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    f = math.floor(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def steady_decode(rs: list[dict]) -> dict | None:
    """Inter-token time while *every* stream of the batch is decoding: a pure decode step of len(rs) seqs."""
    rs = [r for r in rs if r.get("times") and len(r["times"]) > 2]
    if not rs:
        return None
    a = max(r["times"][0] for r in rs)
    b = min(r["times"][-1] for r in rs)
    if b <= a:
        return None
    steps, ctx_mid = [], []
    mid = (a + b) / 2
    for r in rs:
        k = sum(1 for t in r["times"] if a < t <= b)
        if k >= 3:
            steps.append((b - a) / k)
        ctx_mid.append(r["prompt"] + sum(1 for t in r["times"] if t <= mid))
    if not steps:
        return None
    return {
        "step_ms": statistics.median(steps) * 1e3,
        "window_s": b - a,
        "window_tokens": statistics.median([(b - a) / s for s in steps]),
        "ctx_mid": statistics.mean(ctx_mid),
        "seqs": len(rs),
    }
