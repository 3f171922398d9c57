"""The config's sections for the policies, the learned predictor, admission control and the priorities sent to
workers (``gateway.policy_options``, ``gateway.predictor``, ``gateway.admission``, ``gateway.engine_priority``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from router.core.configbase import Frozen as _Frozen
from router.core.configbase import NonNegInt, PosFloat, PosInt


class PolicyOptions(_Frozen):
    long_prompt_tokens: PosInt = 2048
    """`length_split`: prompts of at least this many tokens go to workers tagged `long_tag`."""
    long_tag: str = "long"
    """`length_split`: the tag of the workers for long prompts."""
    latency_slack: Annotated[float, Field(ge=1.0)] = 1.3
    """`predictive` (with `wrong_answer_s: 0`): the most capable worker within this times the fastest's
    predicted p90."""
    affinity_load_ratio: Annotated[float, Field(ge=1.0)] = 2.0
    """`predictive`: prefix-cache affinity is ignored on a worker with more than this times the least loaded
    candidate's in-flight requests (plus `affinity_load_slack`)."""
    affinity_load_slack: NonNegInt = 4
    """`predictive`: see `affinity_load_ratio`."""
    wrong_answer_s: Annotated[float, Field(ge=0)] = 2.0
    """`predictive`: what a wrong answer costs the workflow, in seconds; the policy takes the least `e2e + P(wrong) x
    this` (0: Chimera's slack rule alone)."""
    wrong_answer_stage_s: Annotated[float, Field(ge=0)] = 0.0
    """`predictive`: added to `wrong_answer_s` per stage of the request's workflow (`x-workflow-stage`, capped at 16);
    needs `wrong_answer_s > 0`."""
    sla_miss_s: Annotated[float, Field(gt=0)] | None = None
    """`predictive`: what missing an agent's SLA costs, in seconds: the policy then takes the least `e2e + P(wrong) x
    wrong_answer_s + P(miss) x this` over every worker (P(miss) from the predicted p50 and p90), so a capable
    worker that may be late can win over a fast one that may be wrong (default: the SLA is a constraint: only
    workers predicted to meet it are chosen while there are any); needs `wrong_answer_s > 0`."""
    spread_margin: Annotated[float, Field(ge=0, le=1)] = 0.1
    """`predictive`: workers whose expected cost is within this fraction of the least share the requests, weighted
    by how close they are (a tie evenly, the margin's edge 0.3 of that), so a near tie does not send every step of
    an agent to one worker (0: always the least). Under `wrong_answer_s: 0`: workers of the chosen one's quality
    within this fraction of its p90 e2e."""
    latency_feedback: bool = True
    """`predictive`: scale each worker's predicted TTFT and decode time by how its recent requests ran against their
    predictions."""


class PredictorConfig(_Frozen):
    """The learned latency predictor (``gateway.predictor``); its absence means a prior-only predictor
    where the policy is ``predictive``, and no predictor (no sketches, no refits) otherwise."""

    model: str | None = None
    """A model file from `chimera predictor train`, loaded at start-up (default: the analytic prior)."""
    refit_interval_s: Annotated[float, Field(ge=0)] = 30.0
    """How often the gateway refits the predictor on its own traffic (0: never)."""
    window: PosInt = 5000
    """Completions kept for online refits (bucketed by load)."""
    min_samples: PosInt = 300
    """A refit needs at least this many completions in the window."""
    save: str | None = None
    """Where online refits are written (default: not saved)."""


class AdmissionConfig(_Frozen):
    """Overload handling (``gateway.admission``; absent: every request is dispatched at once).
    See docs/overload.md."""

    kv_full_ratio: Annotated[float, Field(gt=0, le=1)] = 0.8
    """A worker is full when its reserved tokens reach this share of `kv_budget_tokens`."""
    max_waiting: NonNegInt | None = None
    """... or when it reports more waiting requests than this."""
    priority_headroom: Annotated[float, Field(ge=0, lt=1)] = 0.05
    """Each priority level above 0 may fill this much less of `kv_full_ratio` (priority 5: 0.8 x 0.75), so urgent
    agents always find room."""
    max_queue: PosInt = 1000
    """Queued requests at most (beyond: 429)."""
    max_queue_wait_s: PosFloat = 30.0
    """The longest any request waits in the queue, SLA or not."""
    aging_s: PosFloat = 5.0
    """A queued request gains one priority level per `aging_s` waited."""
    tick_s: PosFloat = 0.05
    """How often the queue re-checks capacity (probes, other replicas)."""
    degrade_max_tokens: PosInt = 256
    """`on_overload: degrade` caps `max_tokens` to this."""
    predicted_deadline: bool = True
    """Also refuse or queue a request the policy predicts would miss its SLA."""
    adaptive: bool = False
    """Give each worker a ratio of its own in place of `kv_full_ratio`, moved by feedback: its scraped KV use toward
    `target_kv_usage`, its own queue, its TTFT against its idle value (docs/overload.md)."""
    target_kv_usage: Annotated[float, Field(gt=0, le=1)] = 0.8
    """`adaptive`: the KV use each worker is steered toward."""
    ttft_tolerance: Annotated[float, Field(gt=1)] = 3.0
    """`adaptive`: a worker whose TTFT average exceeds this many times its idle value gets a lower ratio."""


class EnginePriorityConfig(_Frozen):
    """The ``priority`` sent to workers with ``scheduling_policy: priority`` (``gateway.engine_priority``;
    see router/priority.py)."""

    aging_s: PosFloat = 5.0
    """A request sent this much later counts one priority level less urgent."""
    tokens_per_level: PosFloat | None = None
    """With the predictive policy: one level more per this many predicted output tokens left in the request's workflow
    (shortest remaining workflow first)."""
