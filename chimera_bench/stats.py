"""From a run's records to one ``results.json`` entry (the contract's fields, plus a few extras).

Definitions (vLLM's ``bench serve``): TTFT at the first content token the client sees;
TPOT = (e2e - TTFT) / (output tokens - 1), first token excluded; a request meets its agent's SLA
when every objective the agent declares holds (TTFT, TPOT, e2e), and errors never do; goodput is
requests per second meeting their SLA. Latencies, SLA attainment and task success cover the
workflows that *started* inside the measured window ``[warmup, warmup + duration)`` (followed to
their end, however late); throughput, output tokens/s and goodput count every request that
*finished* inside that window, divided by its length (steady-state rates).

``sla_scale`` stretches every objective: on a simulated fleet slowed by ``speedup`` (< 1), all
latencies are 1/speedup times the modelled GPU's, so the objectives are scaled by the same factor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from chimera_bench.client import RequestRecord, RunLog
from router.core.config import Config


def quantiles(values: Iterable[float]) -> dict[str, float | None]:
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"p50": round(float(p50), 2), "p90": round(float(p90), 2), "p99": round(float(p99), 2),
            "mean": round(float(arr.mean()), 2)}  # fmt: skip


def tpot_s(r: RequestRecord) -> float | None:
    if r.e2e_s is None or r.ttft_s is None or r.output_tokens < 2:
        return None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def meets_sla(r: RequestRecord, config: Config, scale: float) -> bool:
    if r.error is not None or r.e2e_s is None:
        return False
    agent = config.agent(r.agent)
    if agent is None:
        return True
    sla = agent.sla
    if sla.ttft_ms is not None and (r.ttft_s is None or r.ttft_s * 1000 > sla.ttft_ms * scale):
        return False
    tpot = tpot_s(r)
    if sla.tpot_ms is not None and tpot is not None and tpot * 1000 > sla.tpot_ms * scale:
        return False
    return not (sla.e2e_ms is not None and r.e2e_s * 1000 > sla.e2e_ms * scale)


def summarize(log: RunLog, config: Config, *, warmup_s: float, duration_s: float, sla_scale: float) -> dict[str, Any]:
    """The measured part of one run as the contract's entry fields (without policy and config)."""
    measured_wf = [w for w in log.workflows if warmup_s <= w.at < warmup_s + duration_s]
    ids = {w.id for w in measured_wf}
    reqs = [r for r in log.requests if r.workflow in ids]
    ok = [r for r in reqs if r.error is None and r.e2e_s is not None]
    good = [r for r in reqs if meets_sla(r, config, sla_scale)]
    # Rates: every request that *finished* inside the window, whichever workflow it belongs to.
    in_window = [r for r in log.requests if r.e2e_s is not None and r.error is None
                 and warmup_s <= r.start + r.e2e_s < warmup_s + duration_s]  # fmt: skip
    window = duration_s
    finished = [w for w in measured_wf if w.end is not None]
    tpots = [t * 1000 for r in ok if (t := tpot_s(r)) is not None]
    by_agent: dict[str, dict[str, Any]] = {}
    for agent in sorted({r.agent for r in reqs}):
        mine = [r for r in reqs if r.agent == agent]
        mine_ok = [r for r in mine if r.error is None]
        by_agent[agent] = {
            "requests": len(mine),
            "sla_attainment": _share(sum(meets_sla(r, config, sla_scale) for r in mine), len(mine)),
            "ttft_ms_p90": quantiles(r.ttft_s * 1000 for r in mine_ok if r.ttft_s is not None)["p90"],
            "e2e_ms_p90": quantiles(r.e2e_s * 1000 for r in mine_ok if r.e2e_s is not None)["p90"],
            "model_share": _shares(r.model for r in mine_ok),
        }
    return {
        "requests": len(reqs),
        "errors": len(reqs) - len(ok),
        "throughput_rps": round(len(in_window) / window, 3),
        "output_tok_per_s": round(sum(r.output_tokens for r in in_window) / window, 1),
        "ttft_ms": quantiles(r.ttft_s * 1000 for r in ok if r.ttft_s is not None),
        "e2e_ms": quantiles(r.e2e_s * 1000 for r in ok if r.e2e_s is not None),
        "tpot_ms": quantiles(tpots),
        "workflow_e2e_ms": quantiles((w.end - w.start) * 1000 for w in finished if w.end is not None and not w.error),
        "sla_attainment": _share(len(good), len(reqs)),
        "goodput_rps": round(sum(meets_sla(r, config, sla_scale) for r in in_window) / window, 3),
        "task_success": _share(sum(w.success for w in measured_wf), len(measured_wf)),
        "task_success_strict": _share(sum(w.success_strict for w in measured_wf), len(measured_wf)),
        "workflows": len(measured_wf),
        "workflow_errors": sum(w.error for w in measured_wf),
        "by_agent": by_agent,
        "model_share": _shares(r.model for r in ok),
        "peak_kv_usage": _peak_kv(log),
    }


def _shares(models: Iterable[str]) -> dict[str, float]:
    """Each model's share of ``models`` (the models that served an agent's answered requests)."""
    counts = Counter(models)
    total = sum(counts.values())
    return {m: round(n / total, 3) for m, n in sorted(counts.items())}


def _share(n: int, d: int) -> float | None:
    return round(n / d, 4) if d else None


def _peak_kv(log: RunLog) -> dict[str, float]:
    """Per worker, the highest KV-cache use the gateway's /fleet reported during the run."""
    peak: dict[str, float] = {}
    for sample in log.fleet_samples:
        for b in sample["backends"]:
            kv = b.get("kv_usage")
            if isinstance(kv, int | float):
                peak[b["name"]] = round(max(peak.get(b["name"], 0.0), float(kv)), 4)
    return peak


def latencies(log: RunLog, warmup_s: float, duration_s: float) -> dict[str, list[float]]:
    """Raw per-request latencies (ms) of the measured part, for the CDF plots."""
    ids = {w.id for w in log.workflows if warmup_s <= w.at < warmup_s + duration_s}
    ok = [r for r in log.requests if r.workflow in ids and r.error is None]
    return {
        "ttft_ms": [r.ttft_s * 1000 for r in ok if r.ttft_s is not None],
        "e2e_ms": [r.e2e_s * 1000 for r in ok if r.e2e_s is not None],
        "workflow_e2e_ms": [
            (w.end - w.start) * 1000 for w in log.workflows if w.id in ids and w.end is not None and not w.error
        ],
    }
