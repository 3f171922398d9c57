"""Output length: p50/p90 of this request's completion tokens, and p50 of its workflow's remaining output.

Features are what a router sees before dispatch: the agent and the model (codes from the training
vocabulary; ``-1`` unseen), the prompt-token estimate, ``max_tokens``, the message count, the
workflow stage (``x-workflow-stage``; ``-1`` none), the endpoint, the prompt's hashed sketch
(:mod:`predictor.sketch`) and a linear read-out of its task terms (``text_len``). The second target,
the tokens this request *and the later stages of its workflow* will generate (``x-workflow-id``
groups them in the log), is Chimera's input for shortest-remaining-workflow-first scheduling; it is
reported with each decision.
"""

from __future__ import annotations

import numpy as np

from predictor.boosting import Array, MultiQuantileRegressor
from predictor.sketch import SKETCH_DIM
from router.core.types import RequestFeatures

TARGETS = ("output_tokens", "workflow_remaining_tokens")
N_COLUMNS = 8 + SKETCH_DIM
MODEL_COLUMN = 1


class OutputLengthModel(MultiQuantileRegressor):
    """:class:`MultiQuantileRegressor` over :func:`length_row` features and :data:`TARGETS`."""


def length_row(f: RequestFeatures, agent_code: float, model_code: float, text_len: float = -1.0) -> list[float]:
    """``text_len``: the log answer length a linear model reads off the prompt's task terms (the topic
    words that set difficulty, the "briefly" / "thoroughly" of the instruction); -1 unknown."""
    sketch = f.sketch if len(f.sketch) == SKETCH_DIM else (0.0,) * SKETCH_DIM
    return [
        agent_code,
        model_code,
        float(f.prompt_tokens),
        float(f.max_tokens) if f.max_tokens else -1.0,
        float(f.message_count),
        -1.0 if f.workflow_stage is None else float(f.workflow_stage),
        0.0 if f.endpoint == "completions" else 1.0,  # chat and the Responses API: messages
        *sketch,
        text_len,
    ]


def length_matrix(f: RequestFeatures, agent_code: float, model_codes: Array, text_len: float = -1.0) -> Array:
    """One row per candidate (they differ only in the model code)."""
    X = np.repeat(np.asarray([length_row(f, agent_code, 0.0, text_len)]), len(model_codes), axis=0)
    X[:, MODEL_COLUMN] = model_codes
    return X
