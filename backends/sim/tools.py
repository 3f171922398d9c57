"""What a request asks of its answer's form: tools, ``tool_choice``, ``parallel_tool_calls`` and a JSON
``response_format`` (chat) or ``text.format`` (Responses), checked as vLLM 0.26 checks them.

The sim answers as vLLM started with ``--enable-auto-tool-choice --tool-call-parser hermes`` does
(:mod:`backends.sim.script` draws the answer). ``tool_choice`` ``"required"`` or a named function always
calls (vLLM forces it with guided decoding, overriding ``response_format``); ``"none"`` never does. Under
``"auto"`` the model's choice is the sim's rule: **it calls tools when the conversation's last message is the
user's, and answers in text otherwise** (after a tool result, or an assistant turn), so a framework's tool
loop — user, calls, results, answer — ends after one round. A JSON ``response_format`` under ``"auto"`` is
answered in JSON, as guided decoding leaves the model no ``<tool_call>`` to write.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from backends.sim.errors import invalid_field, rejected

AUTO, NONE, REQUIRED, NAMED = "auto", "none", "required", "named"


@dataclass(frozen=True)
class Tool:
    """A function tool: its name and its parameters' JSON schema."""

    name: str
    parameters: dict[str, Any] | None


@dataclass(frozen=True)
class Structure:
    """How a request's answer is shaped; :attr:`scripted` when it is not plain text."""

    tools: tuple[Tool, ...] = ()
    choice: str = NONE  # auto | none | required | named
    named: str = ""  # the function a named tool_choice forces
    parallel: bool = True
    json_format: bool = False  # response_format (chat) / text.format (Responses): JSON
    json_schema: dict[str, Any] | None = None  # its schema; None with json_object: any object
    user_last: bool = False  # the conversation's last message is the user's (the "auto" rule)

    @property
    def calls_tools(self) -> bool:
        if self.choice in (REQUIRED, NAMED):
            return bool(self.tools)  # (Responses: "required" among hosted tools only has no function to call)
        return self.choice == AUTO and bool(self.tools) and self.user_last and not self.json_format

    @property
    def scripted(self) -> bool:
        """The answer is tool calls or a JSON document, drawn whole before the engine runs."""
        return self.calls_tools or self.json_format

    def tool(self, name: str) -> Tool:
        return next(t for t in self.tools if t.name == name)


def tools_prompt(tools: list[dict[str, Any]]) -> str:
    """The text the chat template renders the tools into (Hermes-style templates list them, as JSON, in the
    system prompt): counted as prompt tokens, ahead of the messages."""
    return " ".join(["<tools>", *(json.dumps(t, separators=(", ", ": ")) for t in tools), "</tools>"])


# -- /v1/chat/completions --------------------------------------------------------------------------
def parse_chat(req: dict[str, Any], user_last: bool) -> tuple[Structure | None, list[dict[str, Any]]]:
    """The structure of a chat request and its tools as the prompt renders them; ``(None, [])`` when it asks
    for neither tools nor JSON (the plain answer)."""
    raw = req.get("tools")
    if raw == []:
        raise rejected(
            "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.", "body"
        )
    tools = chat_tools(raw) if raw is not None else []
    choice_raw = req.get("tool_choice", AUTO if tools else NONE)
    choice, named = _chat_choice(choice_raw, tools, raw is not None)
    parallel = _parallel(req)
    json_format, schema = _chat_format(req.get("response_format"))
    if choice in (REQUIRED, NAMED):
        json_format, schema = False, None  # vLLM: a forced tool call's schema replaces response_format
    if not tools and not json_format:
        return None, []
    s = Structure(tuple(tools), choice, named, parallel, json_format, schema, user_last)
    return s, list(raw) if isinstance(raw, list) else []


def chat_tools(raw: object) -> list[Tool]:
    if not isinstance(raw, list):
        raise invalid_field(("tools",), "Input should be a valid list", raw, "list_type")
    tools = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise invalid_field(("tools", i), "Input should be a valid dictionary", tool, "model_type")
        if tool.get("type", "function") != "function":
            raise invalid_field(("tools", i, "type"), "Input should be 'function'", tool.get("type"), "literal_error")
        if "function" not in tool:
            raise invalid_field(("tools", i, "function"), "Field required", tool, "missing")
        tools.append(_function(tool["function"], ("tools", i, "function")))
    return tools


def _function(fn: object, loc: tuple[str | int, ...]) -> Tool:
    """A function definition (vLLM's ``FunctionDefinition``): ``name`` required, the rest typed if given."""
    if not isinstance(fn, dict):
        raise invalid_field(loc, "Input should be a valid dictionary", fn, "model_type")
    if "name" not in fn:
        raise invalid_field((*loc, "name"), "Field required", fn, "missing")
    if not isinstance(fn["name"], str):
        raise invalid_field((*loc, "name"), "Input should be a valid string", fn["name"], "string_type")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise invalid_field((*loc, "parameters"), "Input should be a valid dictionary", params, "dict_type")
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise invalid_field((*loc, "description"), "Input should be a valid string", desc, "string_type")
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid_field((*loc, "strict"), "Input should be a valid boolean", strict, "bool_type")
    return Tool(fn["name"], params)


def _chat_choice(value: object, tools: list[Tool], has_tools: bool) -> tuple[str, str]:
    """(choice, named function), as ``ChatCompletionRequest.check_tool_usage`` checks them."""
    if value is None or value == NONE:
        return NONE, ""  # null: vLLM extracts no tool calls from the answer either
    if not has_tools:
        raise rejected("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if value in (AUTO, REQUIRED):
        return str(value), ""
    if not isinstance(value, dict):
        raise rejected(
            f'Invalid value for `tool_choice`: {value}! Only named tools, "none", "auto" or "required" are supported.',
            "tool_choice",
        )
    usage = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
    function = value.get("function")
    if not isinstance(function, dict):
        raise rejected(f"Invalid value for `function`: `{function}` in `tool_choice`! {usage}", "tool_choice.function")
    if "name" not in function:
        raise rejected(f"Expected field `name` in `function` in `tool_choice`! {usage}", "tool_choice.function.name")
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise rejected(f"Invalid `name` in `function`: `{name}` in `tool_choice`! {usage}", "tool_choice.function.name")
    if all(t.name != name for t in tools):
        raise rejected("The tool specified in `tool_choice` does not match any of the specified `tools`", "tool_choice")
    return NAMED, name


def _chat_format(rf: object) -> tuple[bool, dict[str, Any] | None]:
    if rf is None:
        return False, None
    kinds = "'text', 'json_object', 'json_schema', 'structural_tag'"
    kind = rf.get("type") if isinstance(rf, dict) else None
    if not isinstance(rf, dict) or kind not in ("text", "json_object", "json_schema", "structural_tag"):
        raise invalid_field(
            ("response_format",),
            f"Input tag '{kind}' found using 'type' does not match any of the expected tags: {kinds}",
            rf,
            "union_tag_invalid",
        )
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if spec is None:
            raise rejected(
                "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
                "response_format",
            )
        if not isinstance(spec, dict):
            raise invalid_field(("response_format", "json_schema"), "Input should be a valid dictionary", spec,
                                "model_type")  # fmt: skip
        return True, _schema(spec.get("schema"), ("response_format", "json_schema", "schema"))
    return kind == "json_object", None  # "text"; a structural tag is not modelled: text


# -- /v1/responses ---------------------------------------------------------------------------------
def parse_responses(req: dict[str, Any], user_last: bool) -> tuple[Structure, list[dict[str, Any]]]:
    """The structure of a Responses request (``tool_choice`` as ``ResponsesRequest`` normalizes it) and its
    function tools in chat form (``{"type": "function", "function": ...}``, as vLLM renders them)."""
    raw = req.get("tools")
    raw = [] if raw is None else raw
    if not isinstance(raw, list):
        raise invalid_field(("tools",), "Input should be a valid list", raw, "list_type")
    tools, rendered = [], []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise invalid_field(("tools", i), "Unable to extract tag using discriminator 'type'", tool,
                                "union_tag_not_found")  # fmt: skip
        if tool["type"] == "function":
            tools.append(_function(tool, ("tools", i, "function")))
            rendered.append({"type": "function", "function": tool})
        # hosted tools (web_search, mcp, ...) are accepted; with no tool server they are never called
    choice, named = _responses_choice(req.get("tool_choice", AUTO), raw, tools)
    parallel = _parallel(req)
    json_format, schema = _text_format(req.get("text"))
    if choice in (REQUIRED, NAMED):
        json_format, schema = False, None
    s = Structure(tuple(tools), choice, named, parallel, json_format, schema, user_last)
    return s, rendered if choice != NONE else []


def _responses_choice(value: object, raw: list[Any], tools: list[Tool]) -> tuple[str, str]:
    named = isinstance(value, dict) and value.get("type") == "function"
    if not raw:
        if value in (AUTO, NONE):
            return NONE, ""
        if value == REQUIRED:
            raise rejected("Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice")
        if named:
            raise rejected("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")
    if value in (AUTO, NONE, REQUIRED):
        return str(value), ""
    if named and isinstance(value, dict):
        name = value.get("name")
        if not name or all(t.name != name for t in tools):
            raise rejected("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")
        return NAMED, str(name)
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        return AUTO, ""  # allowed_tools, a hosted tool, ...: the model still picks (among the function tools)
    raise invalid_field(("tool_choice",), "Input should be 'none', 'auto' or 'required'", value, "literal_error")


def _text_format(text: object) -> tuple[bool, dict[str, Any] | None]:
    if text is None:
        return False, None
    if not isinstance(text, dict):
        raise invalid_field(("text",), "Input should be a valid dictionary", text, "model_type")
    fmt = text.get("format")
    if fmt is None:
        return False, None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if not isinstance(fmt, dict) or kind not in ("text", "json_object", "json_schema"):
        raise invalid_field(
            ("text", "format"),
            f"Input tag '{kind}' found using 'type' does not match any of the expected tags: "
            "'text', 'json_schema', 'json_object'",
            fmt,
            "union_tag_invalid",
        )
    if kind == "json_schema":
        if not isinstance(fmt.get("name"), str):
            raise invalid_field(("text", "format", "json_schema", "name"), "Field required", fmt, "missing")
        return True, _schema(fmt.get("schema"), ("text", "format", "json_schema", "schema"))
    return kind == "json_object", None


# -- shared ----------------------------------------------------------------------------------------
def _parallel(req: dict[str, Any]) -> bool:
    value = req.get("parallel_tool_calls")
    if value is None:
        return True
    if not isinstance(value, bool):
        raise invalid_field(("parallel_tool_calls",), "Input should be a valid boolean", value, "bool_type")
    return value


def _schema(schema: object, loc: tuple[str, ...]) -> dict[str, Any] | None:
    if schema is not None and not isinstance(schema, dict):
        raise invalid_field(loc, "Input should be a valid dictionary", schema, "dict_type")
    return schema
