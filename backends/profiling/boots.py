"""A fitted profile against two boots of the server: the boot it was fitted on, another one, and the spread between
their measurements, per kind of point. ``chimera profile --fit A.json --model M --against B.json`` prints it when B
holds probes (a profile this command wrote, or a probe's results)::

    python -c "from backends.profiling.boots import main; main()" A.json B.json M

prints the same from two profiles this command wrote, without writing anything.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from backends.profiling.fit import Row, Settings, build_rows, fit_profile, predict
from router.core.profile import Profile, parse_profile

#: the kinds of point reported (an eager decode step is a TPOT too)
KINDS = {"ttft": "TTFT", "decode": "TPOT", "eager": "TPOT", "mix": "mixed step"}


def point(r: Row) -> str:
    """A row's point without its boot: ``ttft p512``, ``decode b32 p256``, ..."""
    return str(r["key"]).split(" ", 1)[1]


def measured(rows: list[Row]) -> dict[str, float]:
    """Each point's measurement (the mean over the boots of ``rows`` that measured it)."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(point(r), []).append(r["y"])
    return {k: float(np.mean(v)) for k, v in by.items()}


def boot_figures(profile: Profile, own: list[Row], other: list[Row]) -> dict[str, dict[str, float]]:
    """Per kind of point (:data:`KINDS`), means over its points of: ``spread``, |a - b| / ((a + b) / 2) of the two
    boots' measurements (the points both measured); ``own``, |predicted / measured - 1| on the boot ``profile`` was
    fitted on (``own``); ``cross``, the same on the other boot (``other``); and ``points``, how many both measured."""
    a, b = measured(own), measured(other)
    pred_own = dict(zip((point(r) for r in own), predict(profile, own), strict=True))
    pred_other = dict(zip((point(r) for r in other), predict(profile, other), strict=True))
    kind = {point(r): KINDS.get(r["kind"], r["kind"]) for r in [*own, *other]}
    out: dict[str, dict[str, float]] = {}
    for k in dict.fromkeys(KINDS.values()):
        both = [p for p in a if p in b and kind[p] == k]
        if not both:
            continue
        out[k] = {"points": len(both),
                  "spread": float(np.mean([abs(a[p] - b[p]) / ((a[p] + b[p]) / 2) for p in both])),
                  "own": float(np.mean([abs(pred_own[p] / a[p] - 1) for p in a if kind[p] == k])),
                  "cross": float(np.mean([abs(pred_other[p] / b[p] - 1) for p in b if kind[p] == k]))}  # fmt: skip
    return out


def format_figures(figures: dict[str, dict[str, float]], own: str, other: str) -> list[str]:
    lines = [f"== fitted on {own} (own boot), against {other} (other boot)",
             "  mean |error| per point; boot-to-boot spread: |own - other| / their mean",
             f"  {'kind':12s} {'points':>6s}  {'boot-to-boot spread':>19s}  {'fit vs own boot':>15s}  "
             f"{'fit vs other boot':>17s}"]  # fmt: skip
    for k, f in figures.items():
        lines.append(f"  {k:12s} {f['points']:6d}  {f['spread']:19.1%}  {f['own']:15.1%}  {f['cross']:17.1%}")
    return lines


def probes_of(data: Any) -> list[dict[str, Any]]:
    """The probes a JSON object holds: a profile `chimera profile` wrote (``raw.probes``), or a probe's results."""
    if isinstance(data, dict) and isinstance(data.get("raw"), dict) and isinstance(data["raw"].get("probes"), list):
        return list(data["raw"]["probes"])
    if isinstance(data, dict) and ("ttft" in data or "tpot" in data or "psweep" in data):
        return [data]
    return []


def main(argv: list[str] | None = None) -> None:
    """``A.json B.json MODEL [--staged]``: fit A's probes as `chimera profile --fit` does (its default settings),
    print the figures against B's."""
    args = list(sys.argv[1:] if argv is None else argv)
    staged = "--staged" in args
    path_a, path_b, model = [x for x in args if x != "--staged"]
    runs_a, runs_b = (probes_of(json.loads(Path(p).read_text())) for p in (path_a, path_b))
    s = Settings(model=model, name=model, staged=staged)
    prof = parse_profile(fit_profile(runs_a, [], s))
    rows_a, rows_b = (build_rows(r, s.max_num_batched_tokens, s.graph_max) for r in (runs_a, runs_b))
    names = (Path(path_a).name, Path(path_b).name)
    print("\n".join(format_figures(boot_figures(prof, rows_a, rows_b), *names)))
