"""``chimera predictor train|eval``: fit the predictor on request logs, and score it (argparse only at
import time; scikit-learn is imported when a command runs). ``chimera predictor collect``, the traffic to
train on, is the bench's (chimera_bench/collect.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from router.core.errors import ArtifactError, ConfigError


def add_arguments(p: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """The ``train`` and ``eval`` commands on ``p``; returns its subcommands (the CLI adds ``collect``)."""
    sub = p.add_subparsers(dest="predictor_command", required=True, parser_class=type(p))
    t = sub.add_parser("train", help="fit a predictor on request logs and save it")
    t.add_argument("--log", action="append", required=True, help="request log (JSON lines); may repeat")
    t.add_argument("--out", required=True, help="where to write the predictor")
    t.add_argument("--holdout", type=float, default=0.0,
                   help="fit on the first 1-H of the log (by arrival) and report accuracy on the rest")  # fmt: skip
    t.add_argument("--json", action="store_true", help="print the report as JSON")
    e = sub.add_parser("eval", help="report a predictor's accuracy on request logs")
    e.add_argument("--log", action="append", required=True, help="request log (JSON lines); may repeat")
    e.add_argument("--model", required=True, help="a predictor file, or 'prior' for the untrained analytic prior")
    e.add_argument("--json", action="store_true", help="print the report as JSON")
    return sub


def _load_samples(paths: list[str]) -> list[Any]:
    from predictor.dataset import read_logs

    try:
        data = read_logs(paths)
    except OSError as exc:
        raise ConfigError(f"cannot read request log: {exc.strerror or exc}", file=exc.filename or paths[0]) from exc
    if not data:
        raise ConfigError("no usable requests in the log (need outcome ok, a backend and fleet features; run the "
                          "gateway with gateway.predictor or the predictive policy)", key="--log")  # fmt: skip
    return data


def _report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    for k, v in report.items():
        if isinstance(v, dict):
            print(f"{k:14} " + "  ".join(f"{kk}={vv}" for kk, vv in v.items()))
        else:
            print(f"{k:14} {v}")


def run(args: argparse.Namespace) -> int:
    from threadpoolctl import threadpool_limits

    from predictor import artifact
    from predictor.evaluate import evaluate
    from predictor.model import Predictor

    data = _load_samples(args.log)
    if args.predictor_command == "train":
        if not 0.0 <= args.holdout < 1.0:
            raise ConfigError("must be in [0, 1)", key="--holdout")
        out = Path(args.out)
        if not args.out or out.is_dir():
            raise ConfigError("must name a file to write the model to", key="--out")
        out.parent.mkdir(parents=True, exist_ok=True)  # an unusable place fails now, not after the fit
        n_fit = len(data) - int(len(data) * args.holdout)
        t0 = time.perf_counter()
        with threadpool_limits(limits=1, user_api="openmp"):  # faster than OpenMP spinning on a shared box
            model = Predictor().fit(data[:n_fit])
        fit_s = time.perf_counter() - t0
        header = artifact.save(model, args.out, {"samples": n_fit, "logs": [str(Path(p)) for p in args.log]})
        factors = {k: round(v, 4) for k, v in model.calibration_factors().items()}
        report: dict[str, Any] = {"trained_on": n_fit, "fit_s": round(fit_s, 2), "out": args.out,
                                  "versions": header["versions"], "p90_factors": factors,
                                  "p90_factors_by_load": {k: [round(v, 4) for v in vs]
                                                          for k, vs in model.load_calibration().items()}}  # fmt: skip
        if n_fit < len(data):
            report["heldout"] = len(data) - n_fit
            report.update({f"heldout_{k}": v for k, v in evaluate(model, data[n_fit:]).items() if k != "samples"})
        _report(report, args.json)
        return 0
    if args.model == "prior":
        from predictor.model import PriorPredictor

        estimator: Any = PriorPredictor()
    else:
        try:
            estimator, _ = artifact.load(args.model)
        except ArtifactError as exc:
            raise ConfigError(str(exc), key="--model") from exc
    _report(evaluate(estimator, data), args.json)
    return 0
