"""Workload generation: deterministic under a seed; the hidden sim fields follow what the router can see."""

from __future__ import annotations

import itertools

import numpy as np

from chimera_bench.client import poisson_arrivals
from chimera_bench.workloads import DETAIL, ROLES, TOPICS, Step, Workflow, make_workflow


def _play(wf: Workflow, verdicts: str = "wrong") -> list[Step]:
    """Run a workflow to its end with a fixed answer verdict for every step."""
    steps = []
    while (step := wf.next_step()) is not None:
        steps.append(step)
        wf.record(step, " ".join(["tok1"] * step.output_tokens) + f" [{verdicts}]")
    return steps


def test_same_seed_same_workflows_other_seed_other_workflows() -> None:
    for workload in ("codegen", "math", "mixed", "chat"):
        a = [_play(make_workflow(workload, 7, i)) for i in range(5)]
        b = [_play(make_workflow(workload, 7, i)) for i in range(5)]
        c = [_play(make_workflow(workload, 8, i)) for i in range(5)]
        assert a == b
        assert a != c
    assert poisson_arrivals(2.0, 30.0, 1) == poisson_arrivals(2.0, 30.0, 1) != poisson_arrivals(2.0, 30.0, 2)
    n = len(poisson_arrivals(4.0, 500.0, 3))
    assert 1800 < n < 2200  # ~ rate x horizon


def test_workflow_shapes_and_growing_contexts() -> None:
    code = _play(make_workflow("codegen", 1, 0))  # every test fails: planner, then 4 rounds
    assert [s.agent for s in code] == ["planner"] + ["coder", "tester"] * 4
    assert all(b.prompt_words > a.prompt_words for a, b in itertools.pairwise(code))
    # each step's messages extend the previous step's (a shared, growing prefix)
    assert code[2].messages[:-1][: len(code[1].messages) - 1] == code[1].messages[:-1]
    assert [s.agent for s in _play(make_workflow("codegen", 1, 0), "correct")] == ["planner", "coder", "tester"]
    assert [s.agent for s in _play(make_workflow("math", 1, 0))] == ["solver", "verifier"] * 2
    assert [s.agent for s in _play(make_workflow("chat", 1, 0))] == ["chat"]
    for step in code:
        assert 4 <= step.output_tokens < step.max_tokens and 0.0 < step.difficulty < 1.0
        assert set(step.sim) == {"output_tokens", "difficulty"}


def test_sim_fields_correlate_with_visible_features() -> None:
    base = {w: d for kind in TOPICS.values() for w, d in kind}
    rows = []  # (agent, topic base difficulty, prompt words, detail, output tokens, step difficulty)
    chat_long = []
    for i in range(600):
        wf = make_workflow("mixed" if i % 3 else "chat", 11, i)
        steps = _play(wf)
        if wf.kind == "chat":
            chat_long.append(steps[0].prompt_words >= 3000)
        for s in steps:
            rows.append((s.agent, base[wf.topic], s.prompt_words, wf.detail, s.output_tokens, s.difficulty, wf))
    # difficulty follows the topic word in the prompt
    first = [(r[1], r[6].difficulty) for r in rows if r[0] in ("planner", "solver")]
    assert np.corrcoef(*zip(*first, strict=True))[0, 1] > 0.9
    # harder tasks come with longer specifications (prompt length of the first step)
    planners = [(r[2], r[6].difficulty) for r in rows if r[0] == "planner"]
    assert np.corrcoef(*zip(*planners, strict=True))[0, 1] > 0.5
    # roles set the answer length: planners write short plans, coders long code
    med = {a: np.median([r[4] for r in rows if r[0] == a]) for a in ("planner", "coder", "tester", "solver")}
    assert med["coder"] > 2 * med["planner"] and med["coder"] > 2 * med["tester"] and med["solver"] > med["tester"]
    # the task's wording ("briefly" / "thoroughly") sets the length too
    coders = [r for r in rows if r[0] == "coder"]
    by_detail = {w: np.median([r[4] for r in coders if r[3] == w]) for w, _, _ in DETAIL}
    assert by_detail["briefly"] < by_detail[""] < by_detail["thoroughly"]
    # and so does difficulty
    assert np.corrcoef([r[4] for r in coders], [r[6].difficulty for r in coders])[0, 1] > 0.3
    assert 0.12 < np.mean(chat_long) < 0.28  # ~20 % long documents
    assert all(ROLES[r[0]].max_tokens > r[4] for r in rows if r[0] != "chat")


def _answer(step: Step, verdict: str) -> str:
    return " ".join(["tok1"] * step.output_tokens) + f" [{verdict}]"


def test_a_check_that_passes_a_wrong_answer_is_not_strict_success_and_rates_the_checker_wrong() -> None:
    """A tester can say ``[correct]`` about a wrong implementation: the workflow then ends as a success by
    the last answer, not strictly; the feedback the bench posts rates that checker's answer as bad (its
    verdict disagreed with the truth), and a checker that rejects a wrong answer as good."""
    for coder_verdict, tester_verdict, strict, checker_good in (
        ("wrong", "correct", False, False),  # a false pass
        ("correct", "correct", True, True),  # a true pass
    ):
        wf = make_workflow("codegen", 1, 0)
        for verdict in ("correct", coder_verdict, tester_verdict):  # planner, coder, tester
            step = wf.next_step()
            assert step is not None
            text = _answer(step, verdict)
            wf.record(step, text)
        assert step.agent == "tester" and wf.next_step() is None
        assert wf.succeeded and wf.succeeded_strict is strict
        assert wf.answer_was_good(step, text) is checker_good
    wf = make_workflow("math", 1, 0)
    solver = wf.next_step()
    assert solver is not None
    wf.record(solver, _answer(solver, "wrong"))
    assert wf.answer_was_good(solver, _answer(solver, "wrong")) is False
    verifier = wf.next_step()
    assert verifier is not None and verifier.agent == "verifier"
    wf.record(verifier, _answer(verifier, "wrong"))  # rightly rejects the wrong solution
    assert wf.answer_was_good(verifier, _answer(verifier, "wrong")) is True
    assert not wf.succeeded and not wf.succeeded_strict
