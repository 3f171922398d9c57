"""The one exception tree of chimera-router.

    ChimeraError
    ├── ConfigError            a config file or CLI argument is wrong (CLI exit 2; file:line: key)
    ├── ProfileError           a worker profile or a simulator setting is unusable (one line; CLI exit 2)
    ├── ArtifactError          a saved predictor model cannot be used here (versions, format)
    ├── LaunchError            a real vLLM worker could not be started, or died (`chimera workers up`)
    ├── SimApiError            the simulated worker answers its caller with this status (vLLM's envelope)
    ├── ClientError            the gateway answers the caller with this status, in OpenAI's envelope
    │   ├── BadRequest              400 invalid_request_error
    │   ├── Unauthorized            401 authentication_error
    │   ├── ModelNotAllowed         403 permission_error
    │   ├── ModelNotFound           404 model_not_found
    │   ├── BodyTooLarge            413 request_too_large
    │   ├── Overloaded              429 rate_limit_exceeded (carries Retry-After)
    │   ├── NoHealthyWorker         503 service_unavailable
    │   ├── UpstreamFailed          502 bad_gateway
    │   └── UpstreamTimedOut        504 gateway_timeout
    └── WorkerError            a worker failed (transport layer); translated at the proxy boundary
        ├── WorkerConnectError      could not connect / connection refused or reset before a byte
        ├── WorkerTimeout           connect, first-byte or between-chunk timeout
        ├── WorkerStatusError       the worker answered an error status (carries status and body)
        └── WorkerProtocolError     the worker answered something that is not a valid response

Lower-layer errors (httpx, redis, yaml, pydantic) never cross a module boundary untranslated:
they are caught where they happen and re-raised as one of these with ``raise ... from exc``.
"""

from __future__ import annotations

import json

SHOWN_CHARS = 64  # the most of a caller's own text an error message repeats


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """``repr(text)`` for an error message, cut to ``limit`` characters with its full length said: a caller's text is
    never reflected without bound."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


class ChimeraError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(ChimeraError):
    """Invalid configuration. ``str()`` is one line: ``file:line: key: message``."""

    def __init__(self, message: str, *, file: str = "", line: int | None = None, key: str = "") -> None:
        self.message = message
        self.file = file
        self.line = line
        self.key = key
        where = file
        if line is not None:
            where = f"{where}:{line}" if where else f"line {line}"
        parts = [p for p in (where, key) if p]
        super().__init__(": ".join([*parts, message]))


class ProfileError(ChimeraError):
    """A profile or a simulator setting is unusable; the message is one line. ``setting``: the
    simulator setting at fault (a ``SimSettings`` field, as ``chimera sim`` names its flag), or
    ``""`` where it is the profile itself."""

    def __init__(self, message: str, *, setting: str = "") -> None:
        super().__init__(message)
        self.setting = setting


class ArtifactError(ChimeraError):
    """A predictor file cannot be used here; the message says why in one line."""


class LaunchError(ChimeraError):
    """A worker could not be started or died (CLI exit 1)."""


class SimApiError(ChimeraError):
    """The simulated worker's answer to a bad request: ``status`` in OpenAI's error envelope, as vLLM
    writes it (``type`` the exception's name, ``code`` the status)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        kind = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed"}.get(
            self.status, "InternalServerError"
        )
        err = {"message": self.message, "type": kind, "param": self.param, "code": self.status}
        return json.dumps({"error": err}).encode()


class ClientError(ChimeraError):
    """An error the gateway reports to its caller in OpenAI's error envelope."""

    status_code: int = 400
    error_type: str = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def envelope(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        return {}


class BadRequest(ClientError):
    status_code = 400
    error_type = "invalid_request_error"


class Unauthorized(ClientError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class ModelNotAllowed(ClientError):
    status_code = 403
    error_type = "permission_error"
    code = "model_not_allowed"


class ModelNotFound(ClientError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class RequestNotFound(ClientError):
    """A request id that is not one of the caller's (``/v1/feedback``)."""

    status_code = 404
    error_type = "invalid_request_error"
    code = "request_not_found"


class BodyTooLarge(ClientError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class Overloaded(ClientError):
    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: float = 1.0, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


class NoHealthyWorker(ClientError):
    status_code = 503
    error_type = "service_unavailable"
    code = "no_healthy_worker"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class UpstreamFailed(ClientError):
    status_code = 502
    error_type = "bad_gateway"
    code = "upstream_error"


class UpstreamTimedOut(ClientError):
    status_code = 504
    error_type = "gateway_timeout"
    code = "upstream_timeout"


class WorkerError(ChimeraError):
    """A worker failed. ``before_first_byte`` tells whether a retry elsewhere is safe. ``public``: what a caller
    may be told (default: the message), where the message holds what only the operator's log should (a transport's
    own text, naming hosts and ports)."""

    def __init__(self, message: str, *, backend: str = "", before_first_byte: bool = True,
                 public: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.backend = backend
        self.before_first_byte = before_first_byte
        self.public = public if public is not None else message


class WorkerConnectError(WorkerError):
    pass


class WorkerTimeout(WorkerError):
    pass


class WorkerStatusError(WorkerError):
    def __init__(self, message: str, *, status_code: int, body: bytes = b"", backend: str = "") -> None:
        super().__init__(message, backend=backend, before_first_byte=True)
        self.status_code = status_code
        self.body = body


class WorkerProtocolError(WorkerError):
    pass
