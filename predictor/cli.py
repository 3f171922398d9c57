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
    t = sub.add_parser("train", help="fit a predictor on request logs or outcome files and save it")
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--log", action="append", help="request log (JSON lines); may repeat")
    src.add_argument("--dataset", action="append",
                     help="outcome file (JSON lines: per prompt, each model's verdict and answer length); may repeat")
    t.add_argument("--out", required=True, help="where to write the predictor")
    t.add_argument("--holdout", type=float, default=0.0,
                   help="--log: fit on the first 1-H of the log (by arrival) and report accuracy on the rest")
    t.add_argument("--folds", type=int, default=0,
                   help="--dataset: first report K-fold accuracy on prompts held out of each fit (0: none)")
    t.add_argument("--models", help="--dataset: only these models' answers (comma-separated)")
    t.add_argument("--json", action="store_true", help="print the report as JSON")
    e = sub.add_parser("eval", help="report a predictor's accuracy on request logs or outcome files")
    src = e.add_mutually_exclusive_group(required=True)
    src.add_argument("--log", action="append", help="request log (JSON lines); may repeat")
    src.add_argument("--dataset", action="append", help="outcome file (JSON lines); may repeat")
    e.add_argument("--models", help="--dataset: only these models' answers (comma-separated)")
    e.add_argument("--model", required=True, help="a predictor file, or 'prior' for the untrained analytic prior")
    e.add_argument("--json", action="store_true", help="print the report as JSON")
    return sub  # fmt: skip


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
        if isinstance(v, dict) and "auc" in v:  # a dataset's scores: one line a model
            _table(k, v)
            continue
        if isinstance(v, dict):
            print(f"{k:14} " + "  ".join(f"{kk}={vv}" for kk, vv in v.items()))
        else:
            print(f"{k:14} {v}")


def _table(title: str, scores: dict[str, Any]) -> None:
    metrics = ("n", "auc", "brier", "ece", "length_mape", "length_tau")
    print(f"{title}: {scores['prompts']} prompts, tasks {', '.join(scores['tasks'])}")
    print(f"  {'model':32} " + " ".join(f"{m:>11}" for m in metrics))
    for model in scores["auc"]:
        cells = ("-" if scores[m][model] is None else f"{scores[m][model]:g}" for m in metrics)
        print(f"  {model:32} " + " ".join(f"{c:>11}" for c in cells))
    f = scores.get("frontier")
    if f:
        print(f"  frontier ({f['prompts']} prompts; cost: {f['cost']}):")
        for m, v in f["single"].items():
            print(f"    {m:32} alone {v['success']:.3f} at {v['cost']:g}; random mixes {f['random'][m]:.3f}, "
                  f"the router {f['router_at'][m]:.3f}, recovering {f['recovered'][m]} of the gap to the oracle")
        print(f"    oracle {f['oracle']['success']:.3f} at {f['oracle']['cost']:g}; the router reaches 99 % of the "
              f"best single model's success at {f['reaches_best']}")  # fmt: skip


def _estimator(name: str) -> Any:
    from predictor import artifact

    if name == "prior":
        from predictor.model import PriorPredictor

        return PriorPredictor()
    try:
        estimator, _ = artifact.load(name)
    except ArtifactError as exc:
        raise ConfigError(str(exc), key="--model") from exc
    return estimator


def _by_metric(per_model: dict[str, dict[str, Any]], prompts: int, tasks: list[str]) -> dict[str, Any]:
    """Per-model scores as one map per metric (``auc``: {model: value}, ...), with the prompts and tasks read."""
    metrics = next(iter(per_model.values())).keys() if per_model else ()
    return {"prompts": prompts, "tasks": tasks, **{k: {m: s[k] for m, s in per_model.items()} for k in metrics}}


def _run_dataset(args: argparse.Namespace) -> int:
    from threadpoolctl import threadpool_limits

    from predictor import artifact, offline
    from predictor.outcomes import read_outcomes

    outcomes = read_outcomes(args.dataset)
    if args.models:
        outcomes = offline.only(outcomes, [m.strip() for m in args.models.split(",") if m.strip()])
    tasks = sorted({o.task for o in outcomes})
    if args.predictor_command == "eval":
        models = sorted({m for o in outcomes for m in o.answers})
        quality, length = offline.predicted(_estimator(args.model), outcomes, models)
        scores = _by_metric(offline.scores(outcomes, models, quality, length), len(outcomes), tasks)
        _report({"scores": {**scores, "frontier": offline.frontier(outcomes, models, quality, length)}}, args.json)
        return 0
    if args.folds == 1 or args.folds < 0 or args.folds > len(outcomes):
        raise ConfigError(f"must be 0 or from 2 to the number of prompts ({len(outcomes)})", key="--folds")
    out = Path(args.out)
    if out.is_dir():
        raise ConfigError("must name a file to write the model to", key="--out")
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    t0 = time.perf_counter()
    with threadpool_limits(limits=1, user_api="openmp"):
        if args.folds:
            per_model, quality, length, models = offline.cross_validate(outcomes, args.folds)
            report["held_out"] = {**_by_metric(per_model, len(outcomes), tasks),
                                  "frontier": offline.frontier(outcomes, models, quality, length)}  # fmt: skip
        model = offline.fit(outcomes)
    header = artifact.save(model, args.out, {"samples": model.n_samples_, "datasets": [str(p) for p in args.dataset]})
    report = {"trained_on": {"prompts": len(outcomes), "answers": model.n_samples_, "tasks": tasks},
              "fit_s": round(time.perf_counter() - t0, 2), "out": args.out, "versions": header["versions"], **report}
    _report(report, args.json)
    return 0


def run(args: argparse.Namespace) -> int:
    from threadpoolctl import threadpool_limits

    from predictor import artifact
    from predictor.evaluate import evaluate
    from predictor.model import Predictor

    if args.dataset:
        return _run_dataset(args)
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
    _report(evaluate(_estimator(args.model), data), args.json)
    return 0
