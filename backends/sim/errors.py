"""vLLM's error envelopes beyond the status-named ones of :class:`~router.core.errors.SimApiError`.

vLLM names an error's ``type`` by where it was caught: a request its pydantic models reject is a
``"Bad Request"`` (FastAPI's validation handler, the message listing pydantic's errors), a route it
does not serve a ``"Not Found"`` (Starlette's), a check in a serving class ``"BadRequestError"``,
``"NotFoundError"`` or the ``err_type`` it passes (``vllm/entrypoints/serve/utils/server_utils.py``).
"""

from __future__ import annotations

import json
from typing import Any

from router.core.errors import SimApiError


class VllmError(SimApiError):
    """A :class:`SimApiError` whose envelope ``type`` is ``kind`` rather than one named by the status."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "BadRequestError") -> None:
        super().__init__(status, message, param)
        self.kind = kind

    def body(self) -> bytes:
        err = {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        return json.dumps({"error": err}).encode()


def not_found() -> VllmError:
    """A path vLLM's server has no route for (as for ``/v1/embeddings`` on a generative model)."""
    return VllmError(404, "Not Found", None, "Not Found")


def invalid_field(loc: tuple[str | int, ...], msg: str, value: object, kind: str = "value_error") -> VllmError:
    """A request field its pydantic model rejects: 400, the error as FastAPI's handler lists it, ``param`` the
    field's dotted path (``body.tools.0.function.name``)."""
    where = ("body", *loc)
    text = f"1 validation error:\n  {{'type': {kind!r}, 'loc': {where!r}, 'msg': {msg!r}, 'input': {value!r}}}"
    return VllmError(400, text, ".".join(map(str, where)), "Bad Request")


def rejected(message: str, param: str | None) -> VllmError:
    """A request a model validator of vLLM's refuses (a ``VLLMValidationError`` naming ``param``)."""
    text = f"1 validation error:\n  {{'type': 'value_error', 'loc': ('body',), 'msg': {('Value error, ' + message)!r}}}"
    return VllmError(400, text, param, "Bad Request")


def json_object(body: bytes, served_model: str | None = None) -> dict[str, Any]:
    """The request body as a JSON object, refused as vLLM refuses it; with ``served_model``, its ``model``
    checked too (absent, null or "" is the served model, as vLLM takes it)."""
    try:
        req = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SimApiError(400, f"Invalid JSON body: {exc}") from exc
    if not isinstance(req, dict):
        raise SimApiError(400, "The request body must be a JSON object")
    if served_model is not None:
        model = req.get("model") or served_model
        if model != served_model:
            raise SimApiError(404, f"The model `{model}` does not exist.", "model")
    return req
