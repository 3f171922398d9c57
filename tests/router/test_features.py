"""Request features: body validation, what the prompt estimate counts, model resolution, SLA headers."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from router.core.errors import BadRequest, ModelNotAllowed, ModelNotFound
from router.core.types import RequestFeatures
from router.features import (
    DEFAULT_OUTPUT_TOKENS,
    build_features,
    parse_body,
    prefill_tokens,
    reserved_tokens,
    resolve_models,
)
from router.feedback import parse_feedback
from router.promptlen import KINDS, prompt_counts
from tests.conftest import make_config

CFG = make_config(
    [
        {"name": "s", "url": "http://127.0.0.1:9001", "model": "small"},
        {"name": "b", "url": "http://127.0.0.1:9002", "model": "big"},
    ],
    agents=[
        {"name": "planner", "models": ["big", "small"], "sla": {"ttft_ms": 800, "tpot_ms": 50}, "priority": 2},
        {"name": "cheap", "models": ["small"]},
    ],
)
PLANNER, CHEAP = CFG.agents


def kinds(p: Any) -> dict[str, float]:
    """The prompt's non-zero counts by kind."""
    return {k: float(v) for k, v in zip(KINDS, p.prompt.kinds, strict=True) if v}


def test_chat_body_features() -> None:
    body = {"model": "auto", "messages": [{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": [{"type": "text", "text": "x" * 40}]}],
            "max_completion_tokens": 64, "stream": True, "sim": {"output_tokens": 9999}}  # fmt: skip
    p = parse_body("chat", body)
    assert (p.model, p.stream, p.max_tokens, p.message_count) == ("auto", True, 64, 2)
    # "be brief" and the part's text, one space between the two: 3 words, 2 gaps; the template's terms
    assert kinds(p) == {"requests": 1, "messages": 2, "words": 3, "letters": 47, "gaps": 2}
    assert p.prompt_tokens == p.prompt.tokens() == prompt_counts("be brief " + "x" * 40, messages=2).tokens()
    no_system = parse_body("chat", {"model": "m", "messages": body["messages"][1:]})
    assert kinds(no_system)["no_system"] == 1 and "no_system" not in kinds(p)  # a template may add its own


@pytest.mark.parametrize(
    ("prompt", "exact", "count"),
    [("one two three", 0, 1), (["ab", "cd"], 0, 2), ([1, 2, 3], 3, 1), ([[1, 2], [3]], 3, 2)],
)
def test_completion_prompt_shapes(prompt: Any, exact: int, count: int) -> None:
    p = parse_body("completions", {"model": "m", "prompt": prompt, "max_tokens": 5})
    assert (p.prompt.exact, p.message_count, p.max_tokens, p.stream) == (exact, count, 5, False)
    if exact:  # token ids are counted, not estimated
        assert p.prompt_tokens == exact and not kinds(p)
    else:  # a raw prompt: no template terms
        assert kinds(p)["words"] == (3 if count == 1 else 2) and "messages" not in kinds(p)


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("chat", [1, 2], None),
        ("chat", {"messages": [{"role": "user", "content": "x"}]}, "model"),
        ("chat", {"model": 3, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ("chat", {"model": "m"}, "messages"),
        ("chat", {"model": "m", "messages": "hi"}, "messages"),
        ("chat", {"model": "m", "messages": []}, "messages"),
        ("chat", {"model": "m", "messages": ["hi"]}, "messages[0]"),
        ("chat", {"model": "m", "messages": [{"role": "user"}], "stream": "yes"}, "stream"),
        ("chat", {"model": "m", "messages": [{"role": "user"}], "max_tokens": "9"}, "max_tokens"),
        ("chat", {"model": "m", "messages": [{"role": "user"}], "max_tokens": 0}, "max_tokens"),
        ("chat", {"model": "m", "messages": [{"role": "u"}], "max_completion_tokens": True}, "max_completion_tokens"),
        ("completions", {"model": "m"}, "prompt"),
        ("completions", {"model": "m", "prompt": {"a": 1}}, "prompt"),
        ("completions", {"model": "m", "prompt": []}, "prompt"),
        ("chat", {"model": "m", "messages": [{"role": "u"}], "n": 0}, "n"),
        ("chat", {"model": "m", "messages": [{"role": "u"}], "n": "2"}, "n"),
        ("completions", {"model": "m", "prompt": "x", "n": True}, "n"),
    ],
)
def test_bad_bodies_are_400_naming_the_param(endpoint: Any, body: Any, param: str | None) -> None:
    with pytest.raises(BadRequest) as info:
        parse_body(endpoint, body)
    assert info.value.param == param
    assert info.value.envelope()["error"]["type"] == "invalid_request_error"


def test_resolve_models() -> None:
    assert resolve_models(CFG, PLANNER, "auto") == ("big", "small")
    assert resolve_models(CFG, PLANNER, "planner") == ("big", "small")
    assert resolve_models(CFG, PLANNER, "small") == ("small",)
    with pytest.raises(ModelNotAllowed):
        resolve_models(CFG, CHEAP, "big")
    with pytest.raises(ModelNotFound):
        resolve_models(CFG, CHEAP, "gpt-4")
    with pytest.raises(ModelNotFound):
        resolve_models(CFG, CHEAP, "planner")  # another agent's name is not a model


def test_features_take_agent_defaults_and_lenient_header_overrides() -> None:
    parsed = parse_body("chat", {"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    f = build_features("chat", PLANNER, ("big", "small"), parsed, {}, seq=7)
    assert (f.agent, f.seq, f.priority, f.ttft_slo_ms, f.tpot_slo_ms, f.max_tokens) == ("planner", 7, 2, 800, 50, None)
    hdrs = {"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "nonsense", "x-priority": "0", "x-workflow-id": "wf-1"}
    f = build_features("chat", PLANNER, ("big",), parsed, hdrs, seq=0)
    # a caller may tighten its SLA and lower its priority, never loosen it or rise above its agent's
    assert (f.ttft_slo_ms, f.tpot_slo_ms, f.priority, f.workflow_id) == (250.0, 50, 2, "wf-1")
    hdrs = {"x-slo-ttft-ms": "5000", "x-slo-tpot-ms": "20", "x-priority": "7"}
    f = build_features("chat", PLANNER, ("big",), parsed, hdrs, seq=0)
    assert (f.ttft_slo_ms, f.tpot_slo_ms, f.priority) == (800, 20.0, 7)
    f = build_features("chat", PLANNER, ("big",), parsed, {"x-slo-ttft-ms": "-3", "x-priority": "high"}, seq=0)
    assert (f.ttft_slo_ms, f.priority) == (800, 2)
    assert reserved_tokens(f) == f.prompt_tokens + DEFAULT_OUTPUT_TOKENS


def test_prefill_tokens_are_the_uncached_prompt_of_a_stream() -> None:
    f = RequestFeatures(agent="a", endpoint="chat", models=("m",), prompt_tokens=1000, max_tokens=None, stream=True,
                        prefix_hits={"w1": 0.75})  # fmt: skip
    assert prefill_tokens(f, "w1") == 250  # the prefix index expects three quarters in w1's cache
    assert prefill_tokens(f, "w2") == 1000
    assert prefill_tokens(dataclasses.replace(f, prefix_hits={}), "w1") == 1000
    assert prefill_tokens(dataclasses.replace(f, stream=False), "w2") == 0  # no first token marks its end


def test_every_answer_asked_for_is_reserved() -> None:
    """``n`` answers (and each prompt of a batched completion) each take their own output tokens."""
    chat = parse_body("chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 50})
    batch = parse_body("completions", {"model": "m", "prompt": ["a b", "c d"], "n": 2, "max_tokens": 50})
    one = parse_body("completions", {"model": "m", "prompt": "a b", "max_tokens": 50})
    assert (chat.sequences, batch.sequences, one.sequences) == (3, 4, 1)
    f = build_features("completions", CHEAP, ("small",), batch, {}, seq=0)
    assert f.sequences == 4 and reserved_tokens(f) == batch.prompt_tokens + 4 * 50
    assert reserved_tokens(f, predicted_output=10) == batch.prompt_tokens + 4 * 10
    f1 = build_features("completions", CHEAP, ("small",), one, {}, seq=0)
    assert reserved_tokens(f1) == one.prompt_tokens + 50


def test_integer_headers_are_bounded() -> None:
    parsed = parse_body("chat", {"model": "auto", "messages": [{"role": "user", "content": "x"}]})
    f = build_features("chat", PLANNER, ("big",), parsed, {"x-priority": "9" * 400, "x-workflow-stage": "7" * 30}, 0)
    assert f.priority == 1000 and f.workflow_stage == 1000  # a 400-digit priority once overflowed a float (500)
    f = build_features("chat", PLANNER, ("big",), parsed, {"x-priority": "-" + "9" * 40}, 0)
    assert f.priority == PLANNER.priority
    # a workflow id is logged and kept in the predictor's window: bounded, visible ASCII, else none
    for wid, kept in (("s1-mixed-0@round_robin-rate4-s1", True), ("w" * 200, True), ("w" * 201, False),
                      ("a b", False), ("\x00x", False), ("é", False)):  # fmt: skip
        f = build_features("chat", PLANNER, ("big",), parsed, {"x-workflow-id": wid}, 0)
        assert f.workflow_id == (wid if kept else None), wid


def test_responses_body_features() -> None:
    body = {"model": "auto", "instructions": "be brief", "max_output_tokens": 64, "stream": True,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "x" * 40}]},
                      {"type": "function_call", "call_id": "c1", "name": "get", "arguments": '{"q": "y"}'},
                      {"type": "function_call_output", "call_id": "c1", "output": "z" * 20}]}  # fmt: skip
    p = parse_body("responses", body)
    assert (p.model, p.stream, p.max_tokens, p.message_count, p.sequences) == ("auto", True, 64, 4, 1)
    # instructions, the message's text, the call's arguments and name, its output
    text = " ".join(["be brief", "x" * 40, '{"q": "y"}', "get", "z" * 20])
    assert (p.prompt.kinds == prompt_counts(text, messages=4).kinds).all()
    plain = parse_body("responses", {"model": "m", "input": "one two"})
    assert kinds(plain) == {"requests": 1, "messages": 1, "no_system": 1, "words": 2, "letters": 6, "gaps": 1}


@pytest.mark.parametrize(
    ("body", "param"),
    [({"model": "m"}, "input"), ({"model": "m", "input": []}, "input"), ({"model": "m", "input": 3}, "input"),
     ({"model": "m", "input": ["x"]}, "input[0]"), ({"model": "m", "input": "x", "max_output_tokens": 0},
                                                     "max_output_tokens")],
)  # fmt: skip
def test_bad_responses_bodies_are_400_naming_the_param(body: Any, param: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_body("responses", body)
    assert info.value.param == param


def test_tools_schemas_and_tool_messages_count_as_prompt() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "search",
            "description": "d " * 2000,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with_tools = parse_body("chat", {**plain, "tools": [tool] * 12})
    assert with_tools.prompt_tokens > 12 * 1000  # the 49 KB of tools a framework sends are most of the prompt
    assert kinds(with_tools)["tools"] == 1 and "tools" not in kinds(parse_body("chat", plain))
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object", "properties": {}}}}
    assert parse_body("chat", {**plain, "response_format": fmt}).prompt_tokens > parse_body("chat", plain).prompt_tokens
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "search", "arguments": '{"q": "' +
                                                                        "w " * 100 + '"}'}}]}  # fmt: skip
    history = {
        "model": "m",
        "messages": [*plain["messages"], call, {"role": "tool", "tool_call_id": "c", "content": "r " * 50}],
    }
    assert parse_body("chat", history).prompt_tokens > 150
    assert kinds(parse_body("chat", history))["words"] >= 2 + 100 + 50  # hi, the call's arguments, the result


def test_an_integral_float_is_an_integer() -> None:
    assert parse_body("chat", {"model": "m", "messages": [{"role": "u"}], "max_tokens": 1.0}).max_tokens == 1
    with pytest.raises(BadRequest):
        parse_body("chat", {"model": "m", "messages": [{"role": "u"}], "max_tokens": 1.5})


@pytest.mark.parametrize(
    ("body", "param"),
    [({"request_id": "0", "score": 0.0, "correct": {}}, "correct"), ({"request_id": "0"}, "score"),
     ({"request_id": "0", "score": None, "correct": True}, "score"), ({"request_id": "0", "score": 2}, "score"),
     ({"request_id": "", "score": 1}, "request_id")],
)  # fmt: skip
def test_feedback_is_refused_where_its_schema_refuses_it(body: Any, param: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_feedback(body)
    assert info.value.param == param


def test_feedback_takes_what_its_schema_allows() -> None:
    assert parse_feedback({"request_id": "r", "score": 0.25}) == ("r", 0.25)
    assert parse_feedback({"request_id": "r", "correct": False, "score": 1}) == ("r", 0.0)
