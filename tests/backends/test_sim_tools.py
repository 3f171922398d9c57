"""Tool calls and JSON answers on the simulated worker's /v1/chat/completions, as vLLM 0.26 with
``--enable-auto-tool-choice --tool-call-parser hermes`` answers them; the official openai SDK as client."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from backends.sim.schema import draw_value
from tests.conftest import ServerThread

SimServer = Callable[..., ServerThread]
Profile = Callable[..., str]

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 2},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
}
SEARCH = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}, "exact": {"type": "boolean"}},
    "required": ["query", "limit", "exact"],
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "search", "parameters": SEARCH}},
]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}


@contextmanager
def sdk(srv: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=30) as client:
        yield client


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def check_calls(calls: Any) -> None:
    """Every call names a tool and carries arguments valid for its schema."""
    assert calls
    for call in calls:
        assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


# -- the tool-call rule ---------------------------------------------------------------------------
def test_a_tool_loop_calls_after_the_user_and_answers_after_the_results(
    sim_server: SimServer, sim_profile: Profile
) -> None:
    srv = sim_server(profile=sim_profile())
    messages: list[Any] = user("what is the weather in Paris?")
    rounds: list[Any] = []
    with sdk(srv) as client:
        for _ in range(5):  # a framework's loop: call the model until it stops asking for tools
            r = client.chat.completions.create(model="sim-test", messages=messages, tools=TOOLS)
            rounds.append(r)
            msg = r.choices[0].message
            if not msg.tool_calls:
                break
            messages.append(msg.model_dump(exclude_none=True))
            for call in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny twenty degrees"})
    assert len(rounds) == 2
    first, last = rounds
    assert first.choices[0].finish_reason == "tool_calls" and first.choices[0].message.content is None
    check_calls(first.choices[0].message.tool_calls)
    assert last.choices[0].finish_reason == "stop" and not last.choices[0].message.tool_calls
    assert len((last.choices[0].message.content or "").split()) == last.usage.completion_tokens  # type: ignore[union-attr]
    # the calls (role, each name and its arguments' words) and the results (role, content) are prompt tokens
    assert first.usage is not None and last.usage is not None
    calls = first.choices[0].message.tool_calls or []
    added = 1 + sum(1 + len(c.function.arguments.split()) for c in calls) + 4 * len(calls)
    assert last.usage.prompt_tokens == first.usage.prompt_tokens + added


def test_tool_choice_none_required_and_named(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile())
    after_result: list[Any] = [
        *user("look it up"),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "found it"},
    ]  # fmt: skip
    with sdk(srv) as client:

        def ask(messages: list[Any], choice: Any, **kw: Any) -> Any:
            return client.chat.completions.create(model="sim-test", messages=messages, tools=TOOLS, tool_choice=choice,
                                                  **kw).choices[0]  # fmt: skip

        none = ask(user("weather?"), "none", extra_body={"sim": {"output_tokens": 5}})
        assert none.finish_reason == "stop" and not none.message.tool_calls
        assert len((none.message.content or "").split()) == 5
        for messages in (user("weather?"), after_result):  # forced: even after a tool result
            required = ask(messages, "required")
            assert required.finish_reason == "tool_calls" and required.message.content == ""
            check_calls(required.message.tool_calls)
            named = ask(messages, {"type": "function", "function": {"name": "search"}})
            assert named.finish_reason == "stop" and named.message.content == ""  # vLLM: "stop" for a named call
            assert [c.function.name for c in named.message.tool_calls or []] == ["search"]
            check_calls(named.message.tool_calls)
        assert not ask(after_result, "auto").message.tool_calls  # auto after a result: text
        several = client.chat.completions.create(model="sim-test", messages=user("weather?"), tools=TOOLS, n=3)
        assert [c.finish_reason for c in several.choices] == ["tool_calls"] * 3  # each answer its own draw
        assert len({str(c.message.tool_calls[0].function) for c in several.choices if c.message.tool_calls}) > 1


def test_parallel_tool_calls_may_make_several_and_false_makes_one(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile())
    with sdk(srv) as client:

        def counts(**kw: Any) -> list[int]:
            out = []
            for k in range(12):
                r = client.chat.completions.create(model="sim-test", messages=user(f"task {k}"), tools=TOOLS, **kw)
                check_calls(r.choices[0].message.tool_calls)
                out.append(len(r.choices[0].message.tool_calls or []))
            return out

        default, single = counts(), counts(parallel_tool_calls=False)
    assert 2 in default and set(default) <= {1, 2}
    assert single == [1] * 12


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(("choice", "finish"), [("auto", "tool_calls"), ("required", "tool_calls"), (NAMED, "stop")])
def test_streamed_calls_accumulate_to_the_full_answer(
    sim_server: SimServer, sim_profile: Profile, choice: Any, finish: str
) -> None:
    srv = sim_server(profile=sim_profile())
    kw: dict[str, Any] = {"model": "sim-test", "messages": user("weather in Oslo and Rome"), "tools": TOOLS,
                          "tool_choice": choice}  # fmt: skip
    with sdk(srv) as client:
        full = client.chat.completions.create(**kw)
        chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
        with client.chat.completions.stream(**kw) as stream:
            for _ in stream:
                pass
            accumulated = stream.get_final_completion()
    want = [(c.function.name, c.function.arguments) for c in full.choices[0].message.tool_calls or []]
    got = [(c.function.name, c.function.arguments) for c in accumulated.choices[0].message.tool_calls or []]
    assert want and got == want  # the same drawn calls, streamed piece by piece
    assert accumulated.choices[0].finish_reason == full.choices[0].finish_reason == finish
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    for index in range(len(want)):
        mine = [d for d in deltas if d.index == index]
        head, rest = mine[0], mine[1:]
        assert head.id and head.id.startswith("chatcmpl-tool-") and head.type == "function"
        assert head.function is not None and head.function.name == want[index][0]
        assert rest and all(d.id is None for d in rest)  # the arguments come in pieces after the opening delta
    assert chunks[-1].usage is not None and full.usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


# -- JSON answers ---------------------------------------------------------------------------------
def test_response_format_json_schema_and_json_object(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile())
    schema = {"type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "number",
              "minimum": 0, "maximum": 1}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2}},
              "required": ["answer", "score", "tags"]}  # fmt: skip
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}}
    with sdk(srv) as client:
        for k in range(5):
            r = client.chat.completions.create(model="sim-test", messages=user(f"grade {k}"), response_format=fmt)
            jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)
            assert r.choices[0].finish_reason == "stop"
        stream = client.chat.completions.create(model="sim-test", messages=user("grade 0"), response_format=fmt,
                                                stream=True)  # fmt: skip
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        first = client.chat.completions.create(model="sim-test", messages=user("grade 0"), response_format=fmt)
        assert streamed == first.choices[0].message.content
        obj = client.chat.completions.create(model="sim-test", messages=user("anything"), tools=TOOLS,
                                             response_format={"type": "json_object"})  # fmt: skip
        assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)  # JSON wins over auto tools
        assert not obj.choices[0].message.tool_calls


def test_a_call_cut_by_max_tokens_is_not_a_call(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile())
    with sdk(srv) as client:
        auto = client.chat.completions.create(model="sim-test", messages=user("weather?"), tools=TOOLS, max_tokens=6)
        assert auto.choices[0].finish_reason == "length" and not auto.choices[0].message.tool_calls
        assert (auto.choices[0].message.content or "").startswith("<tool_call>")  # hermes cannot parse it: text
        named = client.chat.completions.create(
            model="sim-test",
            messages=user("weather?"),
            tools=TOOLS,
            max_tokens=3,
            tool_choice={"type": "function", "function": {"name": "search"}},
        )
        assert named.choices[0].finish_reason == "length"
        args = (named.choices[0].message.tool_calls or [])[0].function.arguments
        with pytest.raises(json.JSONDecodeError):
            json.loads(args)  # the partial arguments, as vLLM passes them on


def test_malformed_tools_and_tool_choices_are_400s(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile())
    base = {"model": "sim-test", "messages": user("hi")}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "body.tools.0.function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
         "body.tools.0.function.parameters"),
        ({"tools": [{"type": "retrieval"}]}, "body.tools.0.type"),
        ({"tools": []}, "body"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
    ]  # fmt: skip
    for extra, param in cases:
        r = httpx.post(f"{srv.url}/v1/chat/completions", json={**base, **extra})
        assert r.status_code == 400, extra
        err = r.json()["error"]
        assert (err["param"], err["code"], err["type"]) == (param, 400, "Bad Request"), extra
    ok = httpx.post(f"{srv.url}/v1/chat/completions", json={**base, "tools": TOOLS, "tool_choice": "none"})
    assert ok.status_code == 200


def test_schema_values_follow_the_schema() -> None:
    schema = {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": 0}},
                            "required": ["x"]}},
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 4}, "when": {"type": "string", "format": "date-time"},
            "kind": {"const": "k"}, "size": {"anyOf": [{"type": "integer", "minimum": 5, "maximum": 6},
                                                       {"type": "null"}]},
            "points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1, "maxItems": 3},
            "flag": {"type": ["boolean", "null"]}, "extra": {"type": "object", "properties": {"deep": {"enum": [1]}}},
        },
        "required": ["name", "when", "kind", "size", "points", "flag"],
    }  # fmt: skip
    values = [draw_value(schema, random.Random(k)) for k in range(50)]
    for v in values:
        jsonschema.validate(v, schema, format_checker=jsonschema.FormatChecker())
    assert any("extra" in v for v in values) and any("extra" not in v for v in values)  # optional: sometimes
    assert values == [draw_value(schema, random.Random(k)) for k in range(50)]  # deterministic in the seed
