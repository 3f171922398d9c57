"""Request logs -> training samples: the same features the gateway built at dispatch.

A request line (``router.requestlog``) carries what the predictor needs: the request's features
(agent, prompt estimate, ``max_tokens``, messages, workflow id and stage, the prompt's sketch), the
chosen worker's state at dispatch (``fleet``: load, KV use, EWMAs, profile, time scale, expected
prefix share) and the outcome (TTFT, TPOT, e2e, completion tokens). Feedback lines
(``{"type": "feedback", "request_id", "score"}``) attach a quality score to their request.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from predictor.model import Sample
from predictor.prior import WorkerProfile, profile_for
from predictor.sharing import unshared
from predictor.sketch import SKETCH_DIM
from router.core.types import BackendView, Endpoint, RequestFeatures

_ENDPOINTS: dict[str, Endpoint] = {"chat": "chat", "completions": "completions", "responses": "responses"}


def read_log(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """(request records, request id -> last feedback score) of a JSON-lines log (gzipped when its name ends in
    ``.gz``, as a rotated log is); bad lines skipped. Raises OSError for a file it cannot read."""
    records: list[dict[str, Any]] = []
    feedback: dict[str, float] = {}
    graders: dict[str, Any] = {}  # request id -> the agent that sent its verdict
    path = Path(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8") as f:
            for line in f:
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(obj, dict):
                    continue
                if obj.get("type") == "feedback":
                    if isinstance(obj.get("request_id"), str) and isinstance(obj.get("score"), int | float):
                        feedback[obj["request_id"]] = float(obj["score"])
                        graders[obj["request_id"]] = obj.get("agent")
                elif obj.get("request_id") and obj.get("endpoint") and _number_or_none(obj.get("ts")):
                    records.append(obj)
    except (EOFError, UnicodeDecodeError) as exc:  # a truncated gzip stream; a binary file
        raise OSError(0, f"{type(exc).__name__}: {exc}", str(path)) from exc
    # a verdict counts only from the agent whose request it was (where the log names both)
    owners = {r["request_id"]: r.get("agent") for r in records}
    foreign = {rid for rid, agent in graders.items() if agent and owners.get(rid) and owners[rid] != agent}
    return records, {rid: score for rid, score in feedback.items() if rid not in foreign}


def read_logs(paths: Sequence[str | Path]) -> list[Sample]:
    """The training samples of several request logs: their records in time order, with every log's
    feedback applied (:func:`read_log`, :func:`samples`). Raises OSError for a log it cannot read."""
    records: list[dict[str, Any]] = []
    feedback: dict[str, float] = {}
    for path in paths:
        r, f = read_log(path)
        records += r
        feedback.update(f)
    records.sort(key=lambda r: r.get("ts") or 0.0)
    return samples(records, feedback)


def usable(rec: Mapping[str, Any]) -> bool:
    return bool(rec.get("outcome") == "ok" and rec.get("backend") and rec.get("model") and rec.get("fleet")
                and rec.get("e2e_s"))  # fmt: skip


def remaining_tokens(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Request id -> tokens it and its workflow's later requests generated (workflow requests only)."""
    by_wf: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        n = r.get("completion_tokens")  # absent or null on a failed request: not a count
        if isinstance(r.get("workflow_id"), str) and n is not None and _number_or_none(n):
            by_wf[r["workflow_id"]].append(r)
    out: dict[str, int] = {}
    for rs in by_wf.values():
        total = 0
        for r in sorted(rs, key=lambda r: r.get("ts") or 0.0, reverse=True):
            total += int(r["completion_tokens"])
            out[r["request_id"]] = total
    return out


def to_sample(
    rec: Mapping[str, Any], remaining: int | None = None, score: float | None = None,
    profiles: Mapping[str, WorkerProfile] | None = None,
) -> Sample:  # fmt: skip
    """One record as a sample; its worker's profile by the name it was logged with, or ``profiles[backend]`` where
    given (a gateway's own profiles, learned ones included: :mod:`predictor.online`)."""
    fl = rec["fleet"]
    sk = rec.get("sketch") or ()  # the 64 dense sketch values, then the task's term ids (router.learning)
    backend, model = rec["backend"], rec["model"]
    features = RequestFeatures(
        agent=rec.get("agent") or "",
        endpoint=_ENDPOINTS.get(rec.get("endpoint") or "", "completions"),
        models=(model,),
        prompt_tokens=int(rec.get("prompt_tokens_est") or rec.get("prompt_tokens") or 0),
        max_tokens=rec.get("max_tokens"),
        stream=bool(rec.get("stream")),
        message_count=int(rec.get("message_count") or 1),
        workflow_id=rec.get("workflow_id"),
        workflow_stage=rec.get("workflow_stage"),
        sketch=tuple(sk[:SKETCH_DIM]),
        terms=tuple(int(t) for t in sk[SKETCH_DIM:]),
        prefix_hits={backend: float(fl.get("prefix_share") or 0.0)},
    )
    view = BackendView(
        name=backend, model=model, kv_budget_tokens=int(fl.get("kv_budget_tokens") or 0),
        inflight_requests=int(fl.get("inflight_requests") or 0), inflight_tokens=int(fl.get("inflight_tokens") or 0),
        # logs written before 2026-11-30 lack it (read as 0: their latency rows' prior misses the backlog; train on
        # logs of one version)
        pending_prefill_tokens=int(fl.get("pending_prefill_tokens") or 0),
        running=fl.get("running"), waiting=fl.get("waiting"), kv_usage=fl.get("kv_usage"),
        metrics_age_s=fl.get("metrics_age_s"), ttft_ewma_s=fl.get("ttft_ewma_s"), tpot_ewma_s=fl.get("tpot_ewma_s"),
    )  # fmt: skip
    profile = (profiles or {}).get(backend) or profile_for(fl.get("profile"), model, float(fl.get("time_scale") or 1.0))
    # the worker's own timings: a decision that priced GPU neighbours recorded the stretch it expected of them
    ttft_s, e2e_s, tpot_s = unshared(rec.get("predicted"), rec.get("ttft_s"), rec.get("e2e_s"), rec.get("tpot_s"))
    return Sample(features, view, profile, ttft_s, tpot_s, e2e_s, rec.get("completion_tokens"), remaining, score)


def samples(
    records: list[dict[str, Any]],
    feedback: Mapping[str, float] | None = None,
    profiles: Mapping[str, WorkerProfile] | None = None,
) -> list[Sample]:
    """Training samples of the usable records, in log order (``profiles``: as :func:`to_sample`)."""
    feedback = feedback or {}
    rem = remaining_tokens(records)
    out = []
    for r in records:
        if not usable(r) or not _well_typed(r):  # a line with a field of the wrong type: skipped
            continue
        try:
            out.append(to_sample(r, rem.get(r["request_id"]), feedback.get(r["request_id"]), profiles))
        except (TypeError, ValueError, AttributeError, KeyError):
            continue
    return out


_NUMBERS = ("ttft_s", "tpot_s", "e2e_s", "completion_tokens", "prompt_tokens", "prompt_tokens_est", "max_tokens",
            "message_count", "workflow_stage")  # fmt: skip
_FLEET_NUMBERS = ("kv_budget_tokens", "inflight_requests", "inflight_tokens", "pending_prefill_tokens", "running",
                  "waiting", "kv_usage", "metrics_age_s", "ttft_ewma_s", "tpot_ewma_s", "prefix_share",
                  "time_scale")  # fmt: skip


def _well_typed(rec: Mapping[str, Any]) -> bool:
    """The numbers a sample is made of are numbers (or absent), as the gateway writes them."""
    fl = rec.get("fleet")
    return (isinstance(fl, dict) and all(_number_or_none(rec.get(k)) for k in _NUMBERS)
            and all(_number_or_none(fl.get(k)) for k in _FLEET_NUMBERS)
            and isinstance(rec.get("sketch") or [], list)
            and all(_number_or_none(v) and v is not None for v in rec.get("sketch") or []))  # fmt: skip


def _number_or_none(v: Any) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))
