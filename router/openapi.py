"""``GET /openapi.json``: an OpenAPI 3.1 description of the gateway's HTTP surface.

Written by hand from the public contract (docs/http-api.md), not derived from the handlers: the
handlers validate only what routing needs and pass the body on, so a schema generated from them
would say less than what a client may send. The request schemas are the OpenAI bodies as far as
the gateway reads them; ``additionalProperties`` stays open because unknown fields go to the worker
unchanged. Every error is OpenAI's envelope. Clients, fuzzers and docs read this; nothing routes by it.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from router.core import paths
from router.core.config import Config
from router.gateway import gateway_of

_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _json_body(schema: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": _ref(schema)}}}


_ERROR = {"description": "an error, in OpenAI's envelope", **_json_body("ErrorEnvelope")}

_MESSAGE: dict[str, Any] = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "examples": ["system", "user", "assistant", "tool"]},
        "content": {
            "anyOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "items": {"type": "object", "properties": {"type": {"type": "string"}, "text": {"type": "string"}}},
                },
                {"type": "null"},
            ]
        },
        "name": {"type": "string"},
    },
}

_COMMON: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1, "description": "a served model, `auto`, or the agent's name"},
    "stream": {"type": "boolean", "default": False},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "n": {"type": "integer", "minimum": 1},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "seed": {"type": "integer"},
    "user": {"type": "string"},
}

_SCHEMAS: dict[str, Any] = {
    "ErrorEnvelope": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    },
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "additionalProperties": True,
        "properties": {
            **_COMMON,
            "messages": {"type": "array", "minItems": 1, "items": _ref("ChatMessage")},
            "max_completion_tokens": {"type": "integer", "minimum": 1},
        },
    },
    "ChatMessage": _MESSAGE,
    "ResponseRequest": {
        "type": "object",
        "required": ["model", "input"],
        "additionalProperties": True,
        "properties": {
            "model": _COMMON["model"],
            "stream": _COMMON["stream"],
            "input": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "minItems": 1, "items": {"type": "object"}},
                ],
                "description": "the prompt: a string, or input items (messages, function calls and their outputs)",
            },
            "instructions": {"type": "string"},
            "max_output_tokens": {"type": "integer", "minimum": 1},
            "tools": {"type": "array", "items": {"type": "object"}},
            "temperature": _COMMON["temperature"],
            "top_p": _COMMON["top_p"],
        },
    },
    "CompletionRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "additionalProperties": True,
        "properties": {
            **_COMMON,
            "prompt": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "minItems": 1, "items": {"type": "string"}},
                    {"type": "array", "minItems": 1, "items": {"type": "integer"}},
                    {"type": "array", "minItems": 1, "items": {"type": "array", "items": {"type": "integer"}}},
                ]
            },
        },
    },
    "Completion": {
        "type": "object",
        "description": "the worker's answer, passed through (usage kept)",
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string"},
            "model": {"type": "string"},
            "choices": {"type": "array"},
            "usage": {"type": "object"},
        },
    },
    "ModelRequest": {
        "type": "object",
        "required": ["model"],
        "additionalProperties": True,
        "properties": {"model": {"type": "string", "minLength": 1}},
    },
    "ModelList": {
        "type": "object",
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {"type": "object"}}},
    },
    "Feedback": {
        "type": "object",
        "required": ["request_id"],
        "anyOf": [{"required": ["score"]}, {"required": ["correct"]}],
        "properties": {
            "request_id": {"type": "string", "minLength": 1, "maxLength": 128},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "correct": {"type": "boolean"},
        },
    },
    "Fleet": {
        "type": "object",
        "properties": {
            "state": {"enum": ["memory", "redis", "degraded"]},
            "policy": {"type": "string"},
            "backends": {"type": "array", "items": {"type": "object"}},
            "replicas": {"type": "array", "items": {"type": "object"}},
            "predicted_for": {
                "type": "object",
                "description": "the reference request behind each backend's predicted_*_ms, and whose "
                "prediction it is (`by`: learned | prior)",
                "properties": {
                    "prompt_tokens": {"type": "integer"},
                    "output_tokens": {"type": "integer"},
                    "by": {"enum": ["learned", "prior"]},
                },
            },
        },
    },
}

_SLO_HEADERS = [
    {"name": "x-slo-ttft-ms", "in": "header", "required": False, "schema": {"type": "number", "exclusiveMinimum": 0}},
    {"name": "x-slo-tpot-ms", "in": "header", "required": False, "schema": {"type": "number", "exclusiveMinimum": 0}},
    {"name": "x-priority", "in": "header", "required": False, "schema": {"type": "integer", "minimum": 0}},
    {"name": "x-request-id", "in": "header", "required": False, "schema": {"type": "string", "maxLength": 128}},
]


def _completion_op(summary: str, schema: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "parameters": _SLO_HEADERS,
        "requestBody": {"required": True, **_json_body(schema)},
        "responses": {
            "200": {
                "description": "the worker's answer; with `stream: true` an SSE stream that ends with `data: [DONE]` "
                "(the Responses API: with its `response.completed` event), or, where the worker broke mid-way, an "
                "error event in OpenAI's envelope",
                "headers": {
                    "X-Chimera-Backend": {"schema": {"type": "string"}},
                    "X-Chimera-Policy": {"schema": {"type": "string"}},
                },
                "content": {
                    "application/json": {"schema": _ref("Completion")},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **{code: _ERROR for code in ("400", "401", "403", "404", "413", "429", "502", "503", "504")},
        },
    }


def _get_op(summary: str, ok: dict[str, Any], errors: tuple[str, ...] = (), admin: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {"200": ok, **{c: _ERROR for c in errors}}}
    if admin:
        op["security"] = [{"adminKey": []}]
    return op


def openapi_document(config: Config) -> dict[str, Any]:
    """The document for this gateway (``config`` decides which security schemes apply)."""
    admin = config.gateway.admin_key is not None
    json_ok = {"description": "ok", "content": {"application/json": {"schema": {"type": "object"}}}}
    admin_errors = ("401",) if admin else ()
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "chimera-router gateway",
            "version": "1",
            "description": "OpenAI-compatible gateway in front of heterogeneous vLLM workers.",
        },
        "paths": {
            paths.CHAT_COMPLETIONS: {"post": _completion_op("Chat completion", "ChatCompletionRequest")},
            paths.COMPLETIONS: {"post": _completion_op("Text completion", "CompletionRequest")},
            paths.RESPONSES: {"post": _completion_op("Response (the Responses API)", "ResponseRequest")},
            paths.MODELS: {
                "get": _get_op(
                    "Models this caller's agent may use", _json_body("ModelList") | {"description": "ok"}, ("401",)
                )
            },
            paths.MODELS + "/{model}": {
                "get": _get_op("One model this caller's agent may use", json_ok, ("401", "404"))
                | {"parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]}
            },
            paths.FEEDBACK: {
                "post": {
                    "summary": "Quality feedback on an answer",
                    "requestBody": {"required": True, **_json_body("Feedback")},
                    "responses": {"200": json_ok, "400": _ERROR, "401": _ERROR, "413": _ERROR},
                }
            },
            **{
                path: {
                    "post": {
                        "summary": summary,
                        "requestBody": {"required": True, **_json_body("ModelRequest")},
                        "responses": {
                            "200": json_ok,
                            **{c: _ERROR for c in ("400", "401", "403", "404", "413", "502", "503", "504")},
                        },
                    }
                }
                for path, summary in (
                    (paths.TOKENIZE, "Tokenize with the model's tokenizer (vLLM's, passed to a worker)"),
                    (paths.DETOKENIZE, "Detokenize with the model's tokenizer (vLLM's, passed to a worker)"),
                    (paths.EMBEDDINGS, "Embeddings (passed to a worker serving the model)"),
                )
            },
            paths.VERSION: {"get": _get_op("The gateway's version", json_ok)},
            paths.HEALTH: {"get": _get_op("The gateway process is up", json_ok)},
            paths.READY: {"get": _get_op("At least one worker is healthy", json_ok, ("503",))},
            paths.METRICS: {
                "get": _get_op(
                    "Prometheus metrics",
                    {"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}},
                    admin_errors,
                    admin,
                )
            },
            paths.FLEET: {
                "get": _get_op(
                    "Every worker's health, load and predicted latency",
                    _json_body("Fleet") | {"description": "ok"},
                    admin_errors,
                    admin,
                )
            },
            paths.OPENAPI: {"get": _get_op("This document", json_ok)},
        },
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {
                "agentKey": {"type": "http", "scheme": "bearer", "description": "an agent's API key"},
                "adminKey": {"type": "http", "scheme": "bearer", "description": "gateway.admin_key"},
            },
        },
    }
    if config.uses_keys:
        doc["security"] = [{"agentKey": []}]
        for path in (paths.HEALTH, paths.READY, paths.METRICS, paths.FLEET, paths.OPENAPI, paths.VERSION):
            doc["paths"][path]["get"].setdefault("security", [])
    return doc


async def openapi_json(request: Request) -> JSONResponse:
    return JSONResponse(openapi_document(gateway_of(request).config))
