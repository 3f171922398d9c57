"""Hypothesis strategies for hostile requests to the gateway, and the checks every answer must pass.

A fuzzed request is (method, path, headers, body bytes). Bodies are drawn from three families:
OpenAI-shaped bodies with mutated fields (wrong types, huge or negative numbers, NaN, lone
surrogates, unknown fields), arbitrary JSON values (deep nesting included), and raw bytes (invalid
UTF-8, truncated JSON, nesting far past the parser's recursion limit). Headers mix valid and wrong
keys, SLA headers that do not parse, and odd request ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
from hypothesis import strategies as st

KEYS = {"planner": "sk-planner-fuzz-0001", "coder": "sk-coder-fuzz-0002"}
MODELS = ["m-small", "m-big"]
COMPLETION_PATHS = ["/v1/chat/completions", "/v1/completions"]
OTHER_PATHS = ["/v1/models", "/v1/feedback", "/health", "/ready", "/metrics", "/fleet", "/openapi.json"]
ENVELOPE_KEYS = {"message", "type", "param", "code"}


@dataclass(frozen=True)
class FuzzRequest:
    method: str
    path: str
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


# -- values --------------------------------------------------------------------------------------

_surrogates = st.text(st.characters(codec=None, categories=["Cs"]), min_size=1, max_size=2)
any_text = st.one_of(  # NUL, RTL marks, astral planes, and now and then a lone surrogate
    st.text(max_size=40), st.lists(st.one_of(st.text(max_size=8), _surrogates), max_size=3).map("".join)
)
huge_ints = st.sampled_from([0, -1, -(2**63), 2**31, 2**63, 2**64 + 1, 10**30, 10**300])
numbers = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    huge_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(1e308),
    st.just(-0.0),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, any_text)
json_values = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(any_text, kids, max_size=4)),
    max_leaves=12,
)
_good_models = st.sampled_from([*MODELS, "auto", "auto", "planner", "coder"])
models = st.one_of(_good_models, _good_models, st.sampled_from(["", "AUTO", "m-small\n", "nope"]), scalars)
contents = st.one_of(
    any_text,
    st.lists(
        st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": st.one_of(any_text, scalars)}),
        max_size=3,
    ),
    json_values,
)
_roles = st.sampled_from(["user", "system", "assistant"])
_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.one_of(_roles, _roles, _roles, scalars)}, optional={"content": contents, "name": any_text}
    ),
    max_size=4,
)
messages = st.one_of(_messages, _messages, _messages, json_values)
prompts = st.one_of(
    any_text,
    any_text,
    st.lists(any_text, max_size=3),
    st.lists(st.integers(-5, 2**40), max_size=5),
    st.lists(st.lists(st.integers(), max_size=3), max_size=3),
    json_values,
)
optional_fields = {
    "stream": st.one_of(st.booleans(), scalars),
    "max_tokens": st.one_of(st.integers(1, 64), numbers, scalars),
    "max_completion_tokens": st.one_of(st.integers(1, 64), numbers),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), json_values),
    "temperature": numbers,
    "n": numbers,
    "stop": st.one_of(any_text, st.lists(any_text, max_size=3), json_values),
    "sim": st.fixed_dictionaries({"output_tokens": numbers, "difficulty": numbers}),
    "unknown_field": json_values,
}


@st.composite
def valid_bodies(draw: st.DrawFn, path: str) -> Any:
    """Bodies the gateway must route: right types, but extreme values and unknown fields."""
    body: dict[str, Any] = {"model": draw(_good_models), "stream": draw(st.booleans())}
    if path.endswith("chat/completions"):
        body["messages"] = [
            {"role": draw(_roles), "content": draw(st.text(max_size=60))} for _ in range(draw(st.integers(1, 3)))
        ]
    else:
        body["prompt"] = draw(st.one_of(st.text(max_size=60), st.lists(st.integers(0, 50_000), min_size=1, max_size=8)))
    if draw(st.booleans()):
        body["max_tokens"] = draw(st.one_of(st.integers(1, 64), st.sampled_from([2**31, 2**63, 10**30])))
    if draw(st.booleans()):
        body[draw(st.sampled_from(["unknown_field", "sim", "logit_bias", "stream_options"]))] = draw(json_values)
    return body


@st.composite
def openai_bodies(draw: st.DrawFn, path: str) -> Any:
    body: dict[str, Any] = {"model": draw(models)}
    if path.endswith("chat/completions"):
        body["messages"] = draw(messages)
    else:
        body["prompt"] = draw(prompts)
    for key, strat in optional_fields.items():
        if draw(st.integers(0, 3)) == 0:
            body[key] = draw(strat)
    if draw(st.integers(0, 9)) == 0:  # a required field missing
        body.pop(draw(st.sampled_from(sorted(body))), None)
    return body


def _nested(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


raw_bodies = st.one_of(
    st.binary(max_size=64),
    st.builds(_nested, st.sampled_from([10, 500, 900, 990, 1000, 5000, 100_000]), st.sampled_from(["list", "dict"])),
    st.sampled_from(
        [
            b"",
            b"null",
            b"[]",
            b"{}",
            b'{"model": "auto", "messages": [',
            b"\xff\xfe{\x00}\x00",
            b'{"model":"auto","messages":[{"role":"user","content":"\xc3\x28"}]}',
            b'{"model":"auto","prompt":"x","max_tokens":' + b"9" * 5000 + b"}",
            b'{"model":"auto","prompt":"x","max_tokens":1e999}',
            b'{"model":"auto","prompt":"\\ud800\\udfff\\ud800"}',
            b'\xef\xbb\xbf{"model":"auto","prompt":"bom"}',
            b'{"model":"auto","prompt":"' + b"a" * (70 * 1024) + b'"}',
            b"[" * 70_000,
        ]
    ),
)


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind <= 3:
        value = draw(valid_bodies(path))
    elif kind <= 5:
        value = draw(openai_bodies(path))
    elif kind <= 7:
        value = draw(json_values)
    else:
        return draw(raw_bodies)
    try:
        data = json.dumps(value, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        return b"{}"
    cut = draw(st.integers(0, 15))
    if cut == 0 and data:  # truncated mid-way
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif cut == 1:  # a stray invalid byte
        at = draw(st.integers(0, len(data)))
        data = data[:at] + b"\xff" + data[at:]
    return data


header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=30)


@st.composite
def fuzz_headers(draw: st.DrawFn) -> tuple[tuple[bytes, bytes], ...]:
    out: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json")]
    auth = draw(st.sampled_from(["planner"] * 8 + ["coder"] * 6 + ["none", "wrong", "basic", "garbled", "prefix"]))
    value = {
        "planner": f"Bearer {KEYS['planner']}",
        "coder": f"Bearer {KEYS['coder']}",
        "none": None,
        "wrong": "Bearer sk-nope",
        "basic": f"Basic {KEYS['planner']}",
        "garbled": draw(header_text),
        "prefix": f"Bearer {KEYS['planner'][:-1]}",
    }[auth]
    if value is not None:
        out.append((b"authorization", value.encode("latin-1")))
    for name in (
        b"x-slo-ttft-ms",
        b"x-slo-tpot-ms",
        b"x-priority",
        b"x-request-id",
        b"x-workflow-id",
        b"x-workflow-stage",
        b"x-agent",
    ):
        if draw(st.integers(0, 4)) == 0:
            v = draw(st.one_of(header_text, st.sampled_from(["nan", "inf", "-1", "1e999", "99999999999999999999999"])))
            out.append((name, v.strip().encode("latin-1")))
    return tuple(out)


@st.composite
def fuzz_requests(draw: st.DrawFn) -> FuzzRequest:
    headers = draw(fuzz_headers())
    pick = draw(st.integers(0, 19))
    if pick < 16:
        path = draw(st.sampled_from(COMPLETION_PATHS))
        return FuzzRequest("POST", path, headers, draw(bodies(path)))
    if pick < 18:
        path = draw(st.sampled_from(OTHER_PATHS))
        method = "POST" if path == "/v1/feedback" else "GET"
        body = draw(bodies(path)) if method == "POST" else b""
        return FuzzRequest(method, path, headers, body)
    method = draw(st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "POST"]))
    path = draw(st.sampled_from([*COMPLETION_PATHS, *OTHER_PATHS, "/", "/v1", "/v1/chat", "/%00", "/..%2f"]))
    return FuzzRequest(method, path, headers, b"")


# -- checks --------------------------------------------------------------------------------------


def envelope_problem(response: httpx.Response) -> str | None:
    """Why an error answer is not OpenAI's envelope (None where it is, or where it is no error)."""
    if response.status_code < 400:
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        return f"{response.status_code} body is not JSON: {response.content[:120]!r}"
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or set(err) != ENVELOPE_KEYS:
        return f"{response.status_code} body is not the envelope: {body!r:.200}"
    if not isinstance(err["message"], str) or not isinstance(err["type"], str):
        return f"{response.status_code} envelope with wrong types: {err!r:.200}"
    if not all(err[k] is None or isinstance(err[k], str) for k in ("param", "code")):
        return f"{response.status_code} envelope with wrong types: {err!r:.200}"
    return None


def variants(req: FuzzRequest) -> list[FuzzRequest]:
    """The request, and for a completion the same body sent to the other completion route and as
    the other agent: four hostile requests for the price of one draw (drawing dominates the cost)."""
    if req.path not in COMPLETION_PATHS:
        return [req]
    other_path = COMPLETION_PATHS[1 - COMPLETION_PATHS.index(req.path)]
    swapped = tuple(
        (
            k,
            v.replace(KEYS["planner"].encode(), b"\0")
            .replace(KEYS["coder"].encode(), KEYS["planner"].encode())
            .replace(b"\0", KEYS["coder"].encode()),
        )
        if k == b"authorization"
        else (k, v)
        for k, v in req.headers
    )
    return [
        req,
        FuzzRequest(req.method, other_path, req.headers, req.body),
        FuzzRequest(req.method, req.path, swapped, req.body),
        FuzzRequest(req.method, other_path, swapped, req.body),
    ]
