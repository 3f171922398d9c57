"""Watch the step lag of running `chimera sim` processes (is the sim keeping its own schedule?).

    python scripts/calibrate/simlag.py --match sim-profiles --out /tmp/lag.jsonl &

Every ``--every`` seconds it finds the `router.cli sim` processes whose command line contains
``--match``, scrapes ``sim:engine_step_lag_seconds`` from each worker's ``/metrics`` (the ``--port``
and every ``--also port=``) and keeps the latest histogram per process and port; when a process
is gone it appends one JSON line: the ports, steps, lag p50/p99 (bucket upper bounds, wall seconds)
and the mean. A sim whose p99 step lag is well above its step time was behind its schedule.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

NAME = "sim:engine_step_lag_seconds"


def sims(match: str) -> dict[int, list[int]]:
    """pid -> ports of the sim processes whose command line contains ``match``."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=False).stdout
    found: dict[int, list[int]] = {}
    for line in out.splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        if "router.cli sim" in args and match in args:
            ports = [int(p) for p in re.findall(r"--port (\d+)", args) + re.findall(r"port=(\d+)", args)]
            found[int(pid)] = ports
    return found


def scrape(port: int) -> dict[str, float] | None:
    """Cumulative bucket counts (le -> count), plus _sum and _count, of the lag histogram."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1.0) as r:
            text = r.read().decode()
    except OSError:
        return None
    h: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(NAME + "_bucket"):
            le = re.search(r'le="([^"]+)"', line)
            if le:
                h[le.group(1)] = h.get(le.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith((NAME + "_sum", NAME + "_count")):
            key = "_sum" if "_sum" in line.split(" ")[0] else "_count"
            h[key] = h.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return h or None


def quantile(h: dict[str, float], q: float) -> float | None:
    n = h.get("_count", 0.0)
    if not n:
        return None
    edges = sorted(((float(k), v) for k, v in h.items() if not k.startswith("_")), key=lambda kv: kv[0])
    for le, c in edges:
        if c >= q * n:
            return le
    return float("inf")


def summary(pid: int, port: int, h: dict[str, float]) -> dict[str, object]:
    n = h.get("_count", 0.0)
    return {
        "pid": pid, "port": port, "steps": int(n), "lag_p50_le_s": quantile(h, 0.5),
        "lag_p99_le_s": quantile(h, 0.99), "lag_mean_s": round(h.get("_sum", 0.0) / n, 5) if n else None,
        "at": time.strftime("%H:%M:%S"),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--match", required=True, help="a string of the sims' command line (e.g. their profile folder)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--every", type=float, default=1.0)
    args = ap.parse_args()
    last: dict[tuple[int, int], dict[str, float]] = {}
    while True:
        live = sims(args.match)
        for (pid, port), h in list(last.items()):
            if pid not in live:
                with Path(args.out).open("a") as f:
                    f.write(json.dumps(summary(pid, port, h)) + "\n")
                del last[(pid, port)]
        for pid, ports in live.items():
            for port in ports:
                h = scrape(port)
                if h:
                    last[(pid, port)] = h
        time.sleep(args.every)


if __name__ == "__main__":
    main()
