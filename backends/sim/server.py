"""The simulated vLLM worker as a plain ASGI app (and a blocking ``serve``).

Plain ASGI rather than a framework: a stream is one ``send`` per engine step, and every layer in
between would be paid per token. The engine runs as one task started and stopped by the lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import math
import os
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST

from backends.listen import listen
from backends.sim import api, flavours, responses, responses_stream, toolchat
from backends.sim import pooling as pooling_api
from backends.sim.api import JSON_HEADERS, SSE_HEADERS, ChunkWriter, Completion
from backends.sim.choices import abort_on_disconnect, complete_many
from backends.sim.engine import Engine, Request, Status
from backends.sim.errors import not_found
from backends.sim.gpu import SharedGPU
from backends.sim.metrics import exposition, make_registry
from backends.sim.script import Script, draw_script
from backends.sim.textgen import VOCAB, Answer, draw_answer, tokenizer_for
from backends.sim.tokenization import Tokenization
from backends.sim.tools import Structure
from backends.sim.waiting import make_queue
from router.core import paths
from router.core.asgi import ASGIApp, Receive, Scope, Send, read_body, respond
from router.core.errors import ProfileError, SimApiError
from router.core.profile import Profile, load_profile, positive_int
from router.core.types import ENGINES

RUNNERS = ("generate", "pooling")  # vLLM's --runner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimSettings:
    model: str | None = None  # served model name; default = profile's "model"
    profile: str = "h200-qwen2.5-1.5b"  # name of a JSON in router/core/profiles, or a path to one
    kv_tokens: int | None = None  # override of the profile's kv_budget_tokens
    speedup: float = 1.0  # >1 faster than real time, <1 slower
    seed: int = 0
    max_num_seqs: int | None = None  # override of the profile's
    max_num_batched_tokens: int | None = None
    scheduling_policy: str = "fcfs"  # vLLM's --scheduling-policy: fcfs | priority
    max_model_len: int | None = None  # vLLM's --max-model-len; default = profile's (capped at the KV capacity)
    engine: str = "vllm"  # whose metrics, health and identity endpoints it serves (backends/sim/flavours.py)
    runner: str = "generate"  # vLLM's --runner: generate (completions) | pooling (embeddings, backends/sim/pooling.py)


def check_settings(settings: SimSettings) -> Profile:
    """The settings' profile, once the settings are checked against it; raises :class:`ProfileError`
    (its ``setting`` naming the field at fault) on bad input."""
    profile = load_profile(settings.profile)
    if not (isinstance(settings.speedup, int | float) and math.isfinite(settings.speedup) and settings.speedup > 0):
        raise ProfileError(f"speedup must be a positive number, got {settings.speedup!r}", setting="speedup")
    if isinstance(settings.seed, bool) or not isinstance(settings.seed, int) or settings.seed < 0:
        raise ProfileError(f"seed must be a non-negative integer, got {settings.seed!r}", setting="seed")
    if settings.model is not None and not settings.model:
        raise ProfileError("model must be a non-empty name", setting="model")
    kv_tokens = positive_int("kv_tokens", settings.kv_tokens) or profile.kv_budget_tokens
    if kv_tokens < profile.block_size:
        raise ProfileError(
            f"kv_tokens must hold at least one block of {profile.block_size} tokens", setting="kv_tokens"
        )
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        positive_int(name, getattr(settings, name))
    make_queue(settings.scheduling_policy)  # raises on an unknown policy
    if settings.runner not in RUNNERS:
        raise ProfileError(f"runner must be one of {', '.join(RUNNERS)}, got {settings.runner!r}", setting="runner")
    if settings.engine not in ENGINES:
        raise ProfileError(f"engine must be one of {', '.join(ENGINES)}, got {settings.engine!r}", setting="engine")
    return profile


def build_engine(settings: SimSettings) -> tuple[Profile, Engine]:
    """Resolve the settings against their profile; raises :class:`ProfileError` on bad input."""
    profile = check_settings(settings)
    engine = Engine(
        profile,
        kv_tokens=settings.kv_tokens or profile.kv_budget_tokens,
        max_num_seqs=settings.max_num_seqs or profile.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens or profile.max_num_batched_tokens,
        speedup=float(settings.speedup),
        seed=settings.seed,
        scheduling_policy=settings.scheduling_policy,
    )
    return profile, engine


class SimApp:
    """Routes the handful of endpoints vLLM's OpenAI server has.

    ``runs_engine=False``: the lifespan leaves the engine's loop to someone else (a :class:`SharedGPU`).
    """

    def __init__(self, settings: SimSettings, *, runs_engine: bool = True) -> None:
        self.settings = settings
        self.runs_engine = runs_engine
        self.profile, self.engine = build_engine(settings)
        self.model = settings.model or self.profile.model
        self.tokenizer = tokenizer_for(self.profile.tokenizer)
        # vLLM refuses to start when max_model_len does not fit the KV cache; the sim caps it instead.
        self.max_model_len = min(settings.max_model_len or self.profile.max_model_len, self.engine.capacity_tokens)
        self.flavour = settings.engine
        self.registry = make_registry(self.engine, self.model, self.flavour)
        self._metrics_path = flavours.METRICS_PATH[self.flavour]
        self._health_paths = flavours.HEALTH_PATHS[self.flavour]
        self._ok = flavours.OK_BODY.get(self.flavour, b"")
        self.tokenization = Tokenization(self.tokenizer, self.model, self.max_model_len)
        self._created = int(time.time())
        # which process answers: `chimera serve` checks it is the worker it started, not one already on the port
        self._health_headers = [*JSON_HEADERS, (api.PID_HEADER.encode(), str(os.getpid()).encode())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await _serve_lifespan(receive, send, self.engine.run if self.runs_engine else None, "sim-engine")

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        try:
            pooling = self.settings.runner == "pooling"
            if pooling and path in (paths.CHAT_COMPLETIONS, paths.COMPLETIONS, paths.RESPONSES):
                raise not_found()  # a pooling model serves no generation routes
            if path == paths.EMBEDDINGS and pooling:
                if method != "POST":
                    raise SimApiError(405, "Method Not Allowed")
                body = await _read_body(receive)
                answer = await pooling_api.embed(self.engine, self.model, self.tokenizer, self.max_model_len, body)
                await respond(send, 200, answer, JSON_HEADERS)
            elif path in (paths.CHAT_COMPLETIONS, paths.COMPLETIONS):
                if method != "POST":
                    raise SimApiError(405, "Method Not Allowed")
                body = await _read_body(receive)
                rid = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), None)
                req = api.parse_completion(
                    body, path.endswith("chat/completions"), self.model, self.max_model_len, self.tokenizer,
                    rid,
                )  # fmt: skip
                await self._complete(req, receive, send)
            elif path == paths.RESPONSES:
                if method != "POST":
                    raise SimApiError(405, "Method Not Allowed")
                call = responses.parse(await _read_body(receive), self.model, self.max_model_len, self.tokenizer)
                make = functools.partial(self._request, call.completion)
                await responses_stream.complete(self.engine, self.model, self.settings.seed, call, make, receive, send)
            elif path.startswith(paths.RESPONSES + "/"):  # retrieve, cancel: nothing is ever stored
                raise responses.not_found(path.removeprefix(paths.RESPONSES + "/").removesuffix("/cancel"))
            elif path in (paths.TOKENIZE, paths.DETOKENIZE):
                if method != "POST":
                    raise SimApiError(405, "Method Not Allowed")
                body = await _read_body(receive)
                t = self.tokenization
                await respond(send, 200, t.tokenize(body) if path == paths.TOKENIZE else t.detokenize(body),
                              JSON_HEADERS)  # fmt: skip
            elif path == paths.EMBEDDINGS:
                raise not_found()  # vLLM serves no pooling routes for a generative model
            elif method != "GET":
                raise SimApiError(
                    405 if path in (paths.HEALTH, paths.MODELS, paths.METRICS, paths.VERSION) else 404,
                    "Method Not Allowed",
                )
            elif path in self._health_paths:
                await respond(send, 200, self._ok, self._health_headers)
            elif path == self._metrics_path:
                await respond(send, 200, exposition(self.registry), [(b"content-type", CONTENT_TYPE_LATEST.encode())])
            elif path == paths.MODELS:
                await respond(send, 200, self._models(), JSON_HEADERS)
            elif (found := self._identity(path)) is not None:
                await respond(send, 200, flavours.dumps(found), JSON_HEADERS)
            else:
                raise SimApiError(404, "Not Found")
        except SimApiError as err:
            await respond(send, err.status, err.body(), JSON_HEADERS)

    def _identity(self, path: str) -> Any:
        return flavours.identity(self.flavour, path, self.engine, self.model, self.max_model_len)

    def _models(self) -> bytes:
        card = {
            "id": self.model,
            "object": "model",
            "created": self._created,
            "owned_by": flavours.OWNED_BY.get(self.flavour, self.model),
            "root": self.model,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        return json.dumps({"object": "list", "data": [card]}).encode()

    def _request(
        self, c: Completion, request_id: str, key: str, prompt_ids: list[int], natural: int | None = None
    ) -> Request:
        """An engine request answering ``c`` for a prompt, its answer drawn on ``key``; ``natural``: the length of
        a scripted answer (no verdict), in place of a drawn one."""
        if natural is None:
            answer = draw_answer(
                self.settings.seed, self.model, key, self.profile.quality, c.output_tokens, c.difficulty
            )
        else:
            answer = Answer(natural_tokens=natural, word_start=0, marker=None)
        return Request(
            request_id,
            prompt_ids,
            answer,
            c.max_tokens,
            c.min_tokens,
            c.ignore_eos,
            arrival=asyncio.get_running_loop().time(),
            random=c.random_sampling,
            priority=c.priority,
        )

    async def _complete(self, c: Completion, receive: Receive, send: Send) -> None:
        if c.structure is not None and c.structure.scripted:  # tool calls, a JSON document
            await self._complete_scripted(c, c.structure, receive, send)
            return
        if c.choices > 1:  # n > 1, or a batch of prompts: one engine request per answer
            await complete_many(self.engine, self.model, c, functools.partial(self._request, c), receive, send)
            return
        req = self._request(c, api.new_id(c.chat, c.request_id), api.answer_key(c, c.prompt_text), c.prompt_ids)
        req.notify_each = c.stream
        watcher = asyncio.create_task(abort_on_disconnect(self.engine, [req], receive))
        self.engine.submit(req)
        try:
            if c.stream:
                await self._stream(req, c, send)
            else:
                while not req.done:
                    await req.wait_for_output(len(req.output))
                if req.status is Status.FINISHED:
                    text = " ".join(VOCAB[k] for k in req.output)
                    await respond(
                        send,
                        200,
                        api.full_response(
                            req.request_id, c.chat, self.model, text, req.finish_reason, req.prompt_len, len(req.output)
                        ),
                        JSON_HEADERS,
                    )
        finally:
            watcher.cancel()
            self.engine.abort(req)  # a no-op unless the handler itself was cancelled

    async def _complete_scripted(self, c: Completion, s: Structure, receive: Receive, send: Send) -> None:
        req_id = api.new_id(True, c.request_id)
        scripts: list[Script] = []
        reqs: list[Request] = []
        for p, (text, ids) in enumerate(c.batch):
            for i in range(c.n):
                key = api.answer_key(c, text, i)
                scripts.append(draw_script(s, self.settings.seed, self.model, key))
                rid = req_id if c.choices == 1 else f"{req_id}-{p * c.n + i}"
                reqs.append(self._request(c, rid, key, ids, len(scripts[-1].pieces)))
        await toolchat.complete(self.engine, self.model, req_id, c, scripts, reqs, receive, send)

    async def _stream(self, req: Request, c: Completion, send: Send) -> None:
        w = ChunkWriter(req.request_id, c.chat, self.model)
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        if c.chat:
            await send({"type": "http.response.body", "body": w.role_chunk(), "more_body": True})
        sent, out, last = 0, req.output, req.final_len - 1
        while True:
            await req.wait_for_output(sent)
            if req.status is Status.ABORTED:
                return
            n = len(out)
            if n > last:
                parts = w.token_chunks(out, sent, last + 1, req.finish_reason)
                if c.include_usage:
                    parts.append(w.usage_chunk(req.prompt_len, n))
                parts.append(api.DONE)
                await send({"type": "http.response.body", "body": b"".join(parts), "more_body": False})
                return
            parts, sent = w.token_chunks(out, sent, n), n
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})


async def _serve_lifespan(
    receive: Receive, send: Send, run: Callable[[], Coroutine[Any, Any, None]] | None, name: str
) -> None:
    """ASGI lifespan: start the clock task (``run``) at start-up, cancel and await it at shutdown."""
    task: asyncio.Task[None] | None = None
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            if run is not None:
                task = asyncio.create_task(run(), name=name)
                task.add_done_callback(_report_engine_death)
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await send({"type": "lifespan.shutdown.complete"})
            return


def _report_engine_death(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the simulated engine stopped", exc_info=task.exception())


async def _read_body(receive: Receive) -> bytes:
    body = await read_body(receive)
    if body is None:
        raise SimApiError(400, "client disconnected")
    return body


class SharedGPUApp:
    """Several simulated workers on one GPU, in one process: each served on its own port (the app
    is picked by the port a connection came in on), with its own engine and /metrics, all engines
    stepping on one :class:`SharedGPU` clock."""

    def __init__(self, workers: Sequence[tuple[SimSettings, int]]) -> None:
        ports = [port for _, port in workers]
        if len(set(ports)) != len(ports):
            raise ProfileError(f"workers sharing a GPU need distinct ports, got {ports}")
        self.apps = {port: SimApp(settings, runs_engine=False) for settings, port in workers}
        self.gpu = SharedGPU([app.engine for app in self.apps.values()])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        server = scope.get("server")
        app = self.apps.get(server[1]) if server else None
        if app is None:
            if scope["type"] == "http":
                await respond(send, 404, SimApiError(404, "Not Found").body(), JSON_HEADERS)
            return
        await app(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await _serve_lifespan(receive, send, self.gpu.run, "sim-gpu")


def create_app(settings: SimSettings) -> ASGIApp:
    """The worker's ASGI app; the engine starts and stops with the ASGI lifespan."""
    return SimApp(settings)


def create_shared_gpu_app(workers: Sequence[tuple[SimSettings, int]]) -> ASGIApp:
    """Workers ``(settings, port)`` that share one GPU, as one ASGI app dispatching on the port."""
    return SharedGPUApp(workers)


def serve(settings: SimSettings, host: str, port: int, *, also: Sequence[tuple[SimSettings, str, int]] = ()) -> None:
    """Run one simulated worker until interrupted (blocking).

    ``also``: more workers ``(settings, host, port)`` on the same GPU as this one, served by this
    process on one shared GPU clock (:mod:`backends.sim.gpu`). Bad settings raise
    :class:`ProfileError`, a port that cannot be listened on :class:`~router.core.errors.ChimeraError`,
    both before anything is served.
    """
    workers = [(settings, host, port), *also]
    app = create_app(settings) if not also else create_shared_gpu_app([(s, p) for s, _, p in workers])
    sockets = listen([(h, p) for _, h, p in workers])
    # The process is ours: keep the long-lived KV-cache tables (up to ~100k entries) out of the
    # cyclic GC's full collections, which otherwise stall the engine for tens of milliseconds.
    gc.freeze()
    config = uvicorn.Config(app, log_level="warning", access_log=False, ws="none", lifespan="on", timeout_keep_alive=30)
    try:
        uvicorn.Server(config).run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
