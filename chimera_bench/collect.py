"""`chimera predictor collect`: training traffic for `chimera predictor train`, from the bench's workloads.

    chimera predictor collect --config examples/bench-hetero-collect.yaml --workload mixed \\
        --rate 1,2,3,4 --seeds 11,13,14 --speedup 0.25 --out logs/train.jsonl
    chimera predictor train --log logs/train.jsonl --out models/predictor.pkl

Runs the bench (``chimera bench``, its workers and a gateway per run) once per seed and rate under a
baseline policy that spreads the requests over every worker (``--policies``, default round robin: the
quality model must see every model answer), with the config's ``gateway.predictor``, or a model-less
one (``refit_interval_s: 0``) where the config has none: the gateway then logs each request's
features and the bench posts every answer's verdict to ``/v1/feedback``. The runs' request logs
(requests, feedback lines) become one log, ``--out``; each workflow id gets its run's name
(``s11-mixed-0@round_robin-rate3-s11``), since every run of a seed replays the same workflows and the
predictor follows a workflow by its id (in one log and across the logs it trains on). The bench's own
files (``results.json``, per-run gateway logs, the config it ran) stay in ``<out>.runs/``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from chimera_bench.runner import BenchSpec, run_bench, validate
from router.core.errors import ConfigError

#: What `gateway.predictor` is where the config has none: log the features, never refit online.
COLLECTING = {"refit_interval_s": 0}


def runs_dir(out: Path) -> Path:
    return out.with_name(out.name + ".runs")


def collect(spec: BenchSpec, out: Path) -> dict[str, Any]:
    """Run ``spec`` (its ``out`` is where the bench's files go) and write its request logs as one log at ``out``."""
    cfg = validate(spec)  # a user's mistake before anything is written
    work = Path(spec.out)
    if any((work / "logs").glob("requests-*.jsonl")):  # the gateways append: they would mix two collections
        raise ConfigError(f"{work} holds an earlier collection's logs: remove it or give another --out", key="--out")
    work.mkdir(parents=True, exist_ok=True)
    if cfg.gateway.predictor is None:
        data = yaml.safe_load(Path(spec.config_path).read_text(encoding="utf-8"))
        data.setdefault("gateway", {})["predictor"] = dict(COLLECTING)
        config = work / "config.yaml"
        config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        spec = replace(spec, config_path=str(config))
    entries = run_bench(spec)
    logs = sorted((work / "logs").glob("requests-*.jsonl"))
    counts = {"runs": len(logs), "requests": 0, "feedback": 0, "errors": sum(int(e["errors"]) for e in entries)}
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for log in logs:
            run = log.stem.removeprefix("requests-")
            for line in log.read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                rec = json.loads(line)
                if rec.get("type") == "feedback":
                    counts["feedback"] += 1
                else:
                    counts["requests"] += 1
                    if isinstance(rec.get("workflow_id"), str):
                        rec["workflow_id"] = f"{rec['workflow_id']}@{run}"
                f.write(json.dumps(rec) + "\n")
    return counts
