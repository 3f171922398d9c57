"""The one table of HTTP paths: what the gateway serves, what a worker serves, and which path a
completion endpoint forwards to. Everything that names a path imports it from here."""

from __future__ import annotations

from typing import Final

from router.core.types import Endpoint

# OpenAI's API, as vLLM's server and the gateway both serve it
CHAT_COMPLETIONS: Final = "/v1/chat/completions"
COMPLETIONS: Final = "/v1/completions"
RESPONSES: Final = "/v1/responses"
MODELS: Final = "/v1/models"
EMBEDDINGS: Final = "/v1/embeddings"
# vLLM's own, beside OpenAI's
TOKENIZE: Final = "/tokenize"
DETOKENIZE: Final = "/detokenize"
VERSION: Final = "/version"

# the gateway's own
FEEDBACK: Final = "/v1/feedback"
HEALTH: Final = "/health"
READY: Final = "/ready"
METRICS: Final = "/metrics"
FLEET: Final = "/fleet"
OPENAPI: Final = "/openapi.json"

#: The completion endpoints, by path, and the path each forwards to on a worker.
COMPLETION_PATHS: Final[dict[str, Endpoint]] = {
    CHAT_COMPLETIONS: "chat",
    COMPLETIONS: "completions",
    RESPONSES: "responses",
}
UPSTREAM_PATHS: Final[dict[Endpoint, str]] = {v: k for k, v in COMPLETION_PATHS.items()}

#: What a vLLM worker answers that the gateway reads: liveness, its Prometheus metrics, its models.
WORKER_HEALTH: Final = HEALTH
WORKER_METRICS: Final = METRICS
WORKER_MODELS: Final = MODELS
