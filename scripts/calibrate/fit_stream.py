#!/usr/bin/env python3
"""Fit the API server's streaming term of the profiles (``frontend_s.stream_token`` and ``stream_wait``) to the
split probes of real vLLM (``split_probe.py``; ``docs/CALIBRATION.md``, "The API server's streaming work").

A request's TTFT on a worker whose API server streams other requests' tokens grows, outside the engine's own queue
and prefill, by ``extra = stream_wait * rho / (1 - rho)`` with ``rho = rate * stream_token``, ``rate`` the streamed
tokens per second. ``extra`` is measured as (client TTFT - vLLM's queue and prefill time) with B streams decoding,
minus the same with none; ``rate`` is B over the decode step that the calibration probe measured at batch B for
that model (its TPOT p256 cells, interpolated), because the split probe did not record the decoders' rate. One pair
for every profile: the work is the API server's Python, the same for every Qwen2.5 size (one vocabulary).

    python scripts/calibrate/fit_stream.py                 # fit, print, write the shipped profiles
    python scripts/calibrate/fit_stream.py --dry-run
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[2]
SPLITS = ROOT / "docs/results/real-h200/split"
FIDELITY = ROOT / "scripts/calibrate/data/fidelity-replay.json"
PROFILES = ROOT / "backends/sim/profiles"
#: The fit's own bound on rho (the formula's pole at 1); the measured points stay below 0.7, where the sim caps it
#: (backends/sim/profile.py STREAM_RHO_MAX).
FIT_RHO_MAX = 0.99


def decode_steps() -> dict[str, tuple[list[int], list[float]]]:
    """Per model: the calibration probe's real TPOT p256 (s) by batch."""
    steps: dict[str, list[tuple[int, float]]] = {}
    for c in json.loads(FIDELITY.read_text()):
        if c["cell"].startswith("TPOT p256 b") and c.get("real"):
            steps.setdefault(c["model"], []).append((int(c["cell"].rsplit("b", 1)[1]), c["real"] / 1e3))
    return {m: ([b for b, _ in sorted(pts)], [t for _, t in sorted(pts)]) for m, pts in steps.items()}


def points(files: list[Path]) -> list[dict]:
    """(model, batch, prompt, rate, extra) for every busy cell against its idle one, all runs."""
    steps, out = decode_steps(), []
    for f in files:
        for worker in json.loads(f.read_text()):
            model, cells = worker["meta"]["model"], worker["cells"]
            if model not in steps or worker["meta"].get("decode_stream", 1) != 1:
                continue
            idle = {c["prompt"]: c["median_ms"] for c in cells if c["batch"] == 0 and c["median_ms"]}
            for c in cells:
                m, b0 = c["median_ms"], idle.get(c["prompt"])
                if not c["batch"] or not m or not b0 or "front_end" not in m:
                    continue
                extra = (m["front_end"] + m["hand_over"]) - (b0["front_end"] + b0["hand_over"])
                rate = c["batch"] / float(np.interp(c["batch"], *steps[model]))
                out.append({"file": f.name, "model": model, "batch": c["batch"], "prompt": c["prompt"],
                            "rate": rate, "extra_ms": extra})  # fmt: skip
    return out


def model(p: np.ndarray, rate: np.ndarray, rho_max: float) -> np.ndarray:
    wait, token = p
    rho = np.minimum(rate * token, rho_max)
    return wait * rho / (1 - rho)


def fit(pts: list[dict], rho_max: float) -> tuple[float, float, np.ndarray]:
    rate = np.array([p["rate"] for p in pts])
    y = np.array([p["extra_ms"] for p in pts]) / 1e3
    # relative errors with a 3 ms floor: the large delays near saturation do not swamp the small ones
    res = least_squares(
        lambda p: (model(p, rate, rho_max) - y) / (0.003 + 0.3 * np.abs(y)),
        [0.02, 5e-5],
        bounds=([0.0, 1e-7], [1.0, 1e-3]),
    )
    return float(res.x[0]), float(res.x[1]), model(res.x, rate, rho_max)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--splits", nargs="*", default=sorted(str(p) for p in SPLITS.glob("split-probe-stream*.json")))
    ap.add_argument("--out-dir", default=str(PROFILES))
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    pts = points([Path(f) for f in a.splits])
    wait, token, pred = fit(pts, FIT_RHO_MAX)
    print(f"stream_wait {wait * 1e3:.2f} ms, stream_token {token * 1e6:.2f} us ({len(pts)} points)")
    for p, m in zip(pts, pred, strict=True):
        print(f"  {p['file']:32s} {p['model']:13s} b={p['batch']:3d} p={p['prompt']:5d} rate {p['rate']:7.0f}/s  "
              f"extra {p['extra_ms']:+6.1f} ms  model {m * 1e3:+6.1f}")  # fmt: skip
    if a.dry_run:
        return
    g = lambda v: float(f"{v:.4g}")  # noqa: E731
    for path in sorted(Path(a.out_dir).glob("h200-*.json")):
        prof = json.loads(path.read_text())
        prof.setdefault("frontend_s", {}).update({"stream_token": g(token), "stream_wait": g(wait)})
        prof.setdefault("provenance", {})["stream"] = {
            "status": "measured" if any(p["model"] == prof["model"] for p in pts) else "not measured: the others' fit",
            "script": "scripts/calibrate/split_probe.py on real vLLM 0.26.0 (h200_validate.sh SPLIT_PROBE=1); "
                      "fit: scripts/calibrate/fit_stream.py",
            "source": [Path(f).name for f in a.splits], "points": len(pts),
            "rate_from": "the calibration probe's real TPOT p256 by batch (data/fidelity-replay.json)",
        }  # fmt: skip
        path.write_text(json.dumps(prof, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
