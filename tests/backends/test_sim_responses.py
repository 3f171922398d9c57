"""The simulated worker's /v1/responses and vLLM's own endpoints (/version, /tokenize, /detokenize, and
/v1/embeddings, which a generative model has not), over the wire with the official openai SDK."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServerThread

SimServer = Callable[..., ServerThread]
Profile = Callable[..., str]

LOOKUP = {"type": "object", "properties": {"key": {"type": "string"}, "n": {"type": "integer", "enum": [1, 2]}},
          "required": ["key", "n"]}  # fmt: skip
TOOLS: list[Any] = [{"type": "function", "name": "lookup", "description": "Look up", "parameters": LOOKUP}]


@contextmanager
def sdk(srv: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=30) as client:
        yield client


def metric(srv: ServerThread, name: str) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{srv.url}/metrics").text):
        for s in family.samples:
            if s.name == name:
                return float(s.value)
    raise KeyError(name)


def test_a_text_response_and_its_usage(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile())
    with sdk(srv) as client:
        r = client.responses.create(model="sim-test", input="say something nice", instructions="be brief",
                                    extra_body={"sim": {"output_tokens": 7}})  # fmt: skip
        chat = client.chat.completions.create(model="sim-test", extra_body={"sim": {"output_tokens": 7}}, messages=[
            {"role": "system", "content": "be brief"}, {"role": "user", "content": "say something nice"}])  # fmt: skip
        cut = client.responses.create(model="sim-test", input="say something nice", max_output_tokens=3,
                                      extra_body={"sim": {"output_tokens": 7}})  # fmt: skip
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed" and r.model == "sim-test"
    assert r.instructions == "be brief" and r.incomplete_details is None and r.created_at > 0
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert len(r.output_text.split()) == 7
    assert r.output_text == chat.choices[0].message.content  # the same prompt draws the same answer
    assert r.usage is not None and chat.usage is not None
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (
        chat.usage.prompt_tokens, 7, chat.usage.prompt_tokens + 7)  # fmt: skip
    assert r.usage.input_tokens == len("system be brief user say something nice".split())
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens" and len(cut.output_text.split()) == 3
    assert cut.max_output_tokens == 3 and r.max_output_tokens == 8192 - r.usage.input_tokens
    assert metric(srv, "vllm:request_success_total") == 3  # through the engine, as chat
    assert r.usage.input_tokens_details.cached_tokens == 0
    with sdk(srv) as client:
        long = " ".join(f"w{i}" for i in range(40))  # 41 tokens with the role: 2 full blocks of 16
        cold, warm = (client.responses.create(model="sim-test", input=long, max_output_tokens=2) for _ in range(2))
    assert cold.usage is not None and warm.usage is not None
    assert (cold.usage.input_tokens_details.cached_tokens, warm.usage.input_tokens_details.cached_tokens) == (0, 32)


def test_a_streamed_response_numbers_its_events(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile())
    with sdk(srv) as client:
        events = list(client.responses.create(model="sim-test", input="hello", stream=True,
                                              extra_body={"sim": {"output_tokens": 5}}))  # fmt: skip
        with client.responses.stream(model="sim-test", input="hello", extra_body={"sim": {"output_tokens": 5}}) as s:
            for _ in s:
                pass
            accumulated = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * 5, "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.completed"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []  # type: ignore[union-attr]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert final.status == "completed" and final.output_text == text and len(text.split()) == 5
    assert final.usage is not None and final.usage.output_tokens == 5
    assert accumulated.output_text == text


def test_a_tool_loop_over_responses(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile())
    items: list[Any] = [{"role": "user", "content": [{"type": "input_text", "text": "find the key"}]}]
    with sdk(srv) as client:
        first = client.responses.create(model="sim-test", input=items, tools=TOOLS)
        calls = [o for o in first.output if o.type == "function_call"]
        assert calls and len(calls) == len(first.output) and first.status == "completed"
        for call in calls:
            assert call.name == "lookup" and call.call_id and call.id.startswith("fc_")
            jsonschema.validate(json.loads(call.arguments), LOOKUP)
            items += [call.model_dump(exclude_none=True),
                      {"type": "function_call_output", "call_id": call.call_id, "output": "the key is 42"}]  # fmt: skip
        second = client.responses.create(model="sim-test", input=items, tools=TOOLS)
        events = list(client.responses.create(model="sim-test", input=items[:1], tools=TOOLS, stream=True))
    assert [o.type for o in second.output] == ["message"] and second.output_text  # after the results: an answer
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + 5 * len(calls)  # calls and results in the prompt
    streamed = [e for e in events if e.type == "response.output_item.done"]
    final = events[-1].response  # type: ignore[union-attr]
    assert [e.item.type for e in streamed] == ["function_call"] * len(final.output)
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == "".join(o.arguments for o in final.output) == "".join(c.arguments for c in calls)


def test_forced_tool_choices_and_json_text_format(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile())
    after: list[Any] = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
    ]
    with sdk(srv) as client:
        required = client.responses.create(model="sim-test", input=after, tools=TOOLS, tool_choice="required")
        named = client.responses.create(model="sim-test", input=after, tools=TOOLS,
                                        tool_choice={"type": "function", "name": "lookup"})  # fmt: skip
        none = client.responses.create(model="sim-test", input="go", tools=TOOLS, tool_choice="none")
        fmt: Any = {"format": {"type": "json_schema", "name": "lookup", "schema": LOOKUP}}
        structured = client.responses.create(model="sim-test", input="go", text=fmt)
    assert required.output and all(o.type == "function_call" for o in required.output)
    assert [o.type for o in named.output] == ["function_call"]
    assert [o.type for o in none.output] == ["message"] and none.tool_choice == "none"
    jsonschema.validate(json.loads(structured.output_text), LOOKUP)


def test_responses_errors_as_vllm_words_them(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile(max_model_len=64))
    with sdk(srv) as client:
        with pytest.raises(openai.NotFoundError) as gone:
            client.responses.create(model="sim-test", input="again", previous_response_id="resp_abc")
        assert gone.value.body["param"] == "response_id" and "resp_abc" in gone.value.body["message"]  # type: ignore[index]
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve("resp_abc")  # no store: nothing to retrieve
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model="nope", input="x")
        with pytest.raises(openai.BadRequestError) as forced:
            client.responses.create(model="sim-test", input="x", tool_choice="required")
        assert forced.value.body["param"] == "tool_choice"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as long:
            client.responses.create(model="sim-test", input=" ".join(["w"] * 60), max_output_tokens=10)
        assert long.value.body["param"] == "input_tokens"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model="sim-test", input="x", tools=[{"type": "function"}])  # type: ignore[list-item]
    missing = httpx.post(f"{srv.url}/v1/responses", json={"model": "sim-test"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "body.input"
    assert httpx.get(f"{srv.url}/v1/responses").status_code == 405


def test_a_client_leaving_a_response_stream_aborts_it(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile(), speedup=1.0)
    body = {"model": "sim-test", "input": "a long one", "stream": True, "sim": {"output_tokens": 4000}}
    with httpx.Client(timeout=10) as client, client.stream("POST", f"{srv.url}/v1/responses", json=body) as r:
        lines = r.iter_lines()  # held: a dropped iterator would close the stream here
        assert any("response.output_text.delta" in line for line in lines)  # the stream is open and generating
        assert metric(srv, "vllm:num_requests_running") == 1
    deadline = time.monotonic() + 5
    while metric(srv, "vllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert metric(srv, "vllm:num_requests_running") == 0 and metric(srv, "vllm:generation_tokens_total") < 4000


def test_version_tokenize_detokenize_and_no_embeddings(sim_server: SimServer, sim_profile: Profile) -> None:
    srv = sim_server(profile=sim_profile())
    tools: list[Any] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages: list[Any] = [{"role": "user", "content": "how many tokens is this"}]
    with sdk(srv) as client:
        chat = client.chat.completions.create(model="sim-test", messages=messages, tools=tools, tool_choice="none",
                                              max_tokens=2)  # fmt: skip
        plain = client.completions.create(model="sim-test", prompt="alpha beta gamma delta", max_tokens=2)
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="sim-test", input="x")
    assert httpx.get(f"{srv.url}/version").json()["version"].startswith("0.26.0")
    tok = httpx.post(f"{srv.url}/tokenize", json={"prompt": "alpha beta gamma delta", "return_token_strs": True}).json()
    assert plain.usage is not None and tok["count"] == len(tok["tokens"]) == plain.usage.prompt_tokens
    assert tok["token_strs"] == ["alpha", "beta", "gamma", "delta"] and tok["max_model_len"] == 8192
    as_chat = httpx.post(f"{srv.url}/tokenize", json={"messages": messages, "tools": tools}).json()
    assert chat.usage is not None and as_chat["count"] == chat.usage.prompt_tokens  # tools counted, as in the chat
    back = httpx.post(f"{srv.url}/detokenize", json={"tokens": tok["tokens"]}).json()
    assert back == {"prompt": "alpha beta gamma delta"}
    zh = [{"role": "user", "content": "请用三句话总结分布式缓存一致性的常见方案，并说明各自的优缺点。"}]  # noqa: RUF001
    with sdk(srv) as client:
        zh_chat = client.chat.completions.create(model="sim-test", messages=zh, max_tokens=2)
    zh_tok = httpx.post(f"{srv.url}/tokenize", json={"messages": zh, "return_token_strs": True}).json()
    assert zh_chat.usage is not None and zh_tok["count"] == zh_chat.usage.prompt_tokens > 15  # CJK cut as usage is
    assert zh_tok["token_strs"][:3] == ["user", "请", "用三"]
    bad = httpx.post(f"{srv.url}/detokenize", json={"tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "body.tokens.0"
    embed = httpx.post(f"{srv.url}/v1/embeddings", json={"input": "x"})
    assert embed.status_code == 404 and embed.json()["error"]["type"] == "Not Found"
