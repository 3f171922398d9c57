"""Saved predictors: a pickle stream of a plain header, then the estimator.

The header (format, schema version, python / scikit-learn / numpy versions, creation time, free
``meta``) is read and checked *before* the estimator is unpickled, so a model written by another
library version is refused with a clear :class:`ArtifactError` instead of half-loading (pickled
scikit-learn trees are only guaranteed to load in the version that wrote them). Only load files
you trust: unpickling runs code.
"""

from __future__ import annotations

import pickle
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import sklearn

from router.core.errors import ArtifactError

FORMAT = "chimera-predictor"
SCHEMA_VERSION = 6  # bump when feature columns or the Predictor's layout change
# What a file of an older schema lacks, for the refusal's message.
SCHEMA_CHANGES = {
    6: "the prior's eager prefill steps, API-server intake and streaming, and async scheduling's wait",
    5: "the quality model's per-model term weights and the prior's prefill backlog",
    4: "the latency p90s' calibration per load bucket",
    3: "the p90s' conformal calibration",
    2: "the per-prompt quality model",
}


def versions() -> dict[str, str]:
    return {
        "python": ".".join(platform.python_version_tuple()[:2]),
        "sklearn": sklearn.__version__,
        "numpy": np.__version__,
    }


def save(estimator: Any, path: str | Path, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``estimator`` with its header; returns the header."""
    header = {"format": FORMAT, "schema": SCHEMA_VERSION, "versions": versions(), "created": time.time(),
              "meta": meta or {}}  # fmt: skip
    write(Path(path), header, estimator)
    return header


def write(path: Path, header: dict[str, Any], estimator: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as f:
            pickle.dump(header, f, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.dump(estimator, f, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(path)  # readers never see a half-written model
    except BaseException:
        tmp.unlink(missing_ok=True)  # (a full disk, a path that is a directory: no half file left behind)
        raise


# what unpickling a file that is not (or no longer) what it should be can raise: a truncated copy, a class
# this code lacks, an unknown protocol, bytes that happen to parse as some other object's
_UNREADABLE = (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError,
               IndexError, KeyError, MemoryError)  # fmt: skip


def read_header(path: str | Path) -> dict[str, Any]:
    try:
        with Path(path).open("rb") as f:
            header = pickle.load(f)
    except _UNREADABLE as exc:
        raise ArtifactError(f"{path}: cannot read a predictor: {str(exc) or type(exc).__name__}") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ArtifactError(f"{path}: not a chimera predictor file")
    return header


def load(path: str | Path) -> tuple[Any, dict[str, Any]]:
    """The estimator and its header. Raises ArtifactError on a schema or library version mismatch."""
    header = read_header(path)
    schema = header.get("schema")
    if schema != SCHEMA_VERSION:
        lacks = [SCHEMA_CHANGES[v] for v in range(SCHEMA_VERSION, 1, -1) if isinstance(schema, int) and v > schema]
        why = f" (it lacks {', '.join(lacks)})" if lacks else ""
        raise ArtifactError(f"{path}: predictor schema {schema} but this code reads {SCHEMA_VERSION}{why}; "
                            "retrain with `chimera predictor train`")  # fmt: skip
    saved, here = header.get("versions", {}), versions()
    wrong = [f"{k} {saved.get(k)} (here {v})" for k, v in here.items() if saved.get(k) != v]
    if wrong:
        raise ArtifactError(f"{path}: written with {', '.join(wrong)}; retrain with `chimera predictor train`")
    try:
        with Path(path).open("rb") as f:
            pickle.load(f)
            estimator = pickle.load(f)
    except _UNREADABLE as exc:  # a header whole, the model behind it cut off or not one of ours
        raise ArtifactError(f"{path}: cannot read the predictor's model: {str(exc) or type(exc).__name__}") from exc
    return estimator, header
