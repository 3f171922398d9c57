"""A pass-through proxy that makes a real vLLM worker honour the bench's hidden ``sim`` fields.

The bench sends every request with ``sim: {output_tokens, difficulty}``, which only the simulated
worker reads; a real vLLM with random weights (``--load-format dummy``) ignores it and generates
until ``max_tokens``, with noise for text, so the same workload would be far longer on real GPUs
and no workflow would ever end ``[correct]``. To run *the same* workload on both, this proxy sits
in front of one vLLM worker and, for completions only:

* sets ``max_tokens = min_tokens = output_tokens`` (minus the verdict token) and ``ignore_eos``, so
  vLLM computes exactly as many tokens as the sim would;
* reads them from ``metadata.sim`` where ``sim`` is missing, as the sim does (a peer router may drop ``sim``),
  and takes that key out, so vLLM sees OpenAI's metadata only;
* draws the verdict as the sim does (:func:`backends.sim.textgen.draw_answer`, the profile's
  quality against ``difficulty``) and appends it to the answer's last piece, counting it in ``usage``.

Everything else (``/health``, ``/metrics``, ``/v1/models``, ``/reset_prefix_cache``) passes through
unchanged. The gateway never sees this: it routes to the proxy's URL as to any worker. Bench-only.

    python -m chimera_bench.simfields --port 9001 --upstream http://127.0.0.1:8001 --profile h200-qwen2.5-0.5b
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx

from backends.sim.api import packed_sim
from backends.sim.textgen import chat_text, draw_answer
from backends.transport import WORKER_KEEPALIVE_S, AiohttpTransport
from router.core.asgi import Scope, read_body
from router.proxy import run_until_disconnect

_HOP = {b"host", b"content-length", b"transfer-encoding", b"connection"}


@dataclass(frozen=True)
class Rewrite:
    body: dict[str, Any]
    marker: str | None  # appended to the answer's last piece


def rewrite(body: dict[str, Any], *, quality: float, seed: int, chat: bool) -> Rewrite:
    """The request vLLM should see, and the verdict to append (the sim's own draw)."""
    sim = body.pop("sim", None)
    if sim is None:  # through a peer that drops unknown fields, as the sim reads it (simulator.md)
        try:
            sim = packed_sim(body)
        except ValueError:
            sim = None
    if isinstance(meta := body.get("metadata"), dict) and "sim" in meta:  # vLLM sees the client's metadata only
        del meta["sim"]
        if not meta:
            del body["metadata"]
    if not isinstance(sim, dict) or not isinstance(sim.get("output_tokens"), int):
        return Rewrite(body, None)
    out = max(1, sim["output_tokens"])
    difficulty = sim.get("difficulty")
    raw_prompt = body.get("prompt")
    prompt = chat_text(body.get("messages") or []) if chat else raw_prompt if isinstance(raw_prompt, str) else ""
    key = prompt if body.get("seed") is None else f"{body['seed']}\x00{prompt}"
    model = str(body.get("model", ""))
    marker = draw_answer(seed, model, key, quality, out, difficulty).marker if difficulty is not None else None
    cap = body.pop("max_completion_tokens", None)
    cap = body.get("max_tokens") or cap
    if isinstance(cap, int) and out > cap:  # the sim truncates too: no verdict at the cap
        out, marker = cap, None
    n = max(1, out - (1 if marker else 0))
    body.update(max_tokens=n, min_tokens=n, ignore_eos=True)
    return Rewrite(body, marker)


def patch_event(data: bytes, marker: str, chat: bool) -> bytes:
    """One SSE ``data:`` payload with the verdict appended to the finishing choice and counted in usage."""
    if data.strip() == b"[DONE]" or (b'"finish_reason":null' in data and b'"usage":{' not in data):
        return data
    try:
        obj = json.loads(data)
    except ValueError:
        return data
    changed = _patch(obj, marker, chat, stream=True)
    return json.dumps(obj, separators=(",", ":")).encode() if changed else data


def _patch(obj: Any, marker: str, chat: bool, *, stream: bool) -> bool:
    if not isinstance(obj, dict):
        return False
    changed = False
    for choice in obj.get("choices") or []:
        if isinstance(choice, dict) and choice.get("finish_reason") is not None:
            holder = (
                (choice.setdefault("delta", {}) if stream else choice.setdefault("message", {})) if chat else choice
            )
            key = "content" if chat else "text"
            text = holder.get(key) or ""
            holder[key] = f"{text} {marker}"
            changed = True
    usage = obj.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        usage["completion_tokens"] += 1
        if isinstance(usage.get("total_tokens"), int):
            usage["total_tokens"] += 1
        changed = True
    return changed


class SimFieldsProxy:
    """ASGI app: rewrite completions per :func:`rewrite`, pass everything else through."""

    def __init__(
        self, upstream: str, *, quality: float, seed: int = 0, client: httpx.AsyncClient | None = None
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.quality = quality
        self.seed = seed
        # The gateway's own wire (aiohttp's pool and parser under httpx's API, its keep-alive): a hop the real
        # runs have and the simulated ones do not, so it should cost as little as the gateway's does.
        self.client = client or httpx.AsyncClient(
            transport=AiohttpTransport(httpx.Limits(max_connections=None, keepalive_expiry=WORKER_KEEPALIVE_S)),
            timeout=httpx.Timeout(600.0, connect=5.0), trust_env=False,
        )  # fmt: skip

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await self.client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await read_body(receive)
        if body is None:
            return  # the client left before its request was complete
        path = scope["path"]
        marker, chat = None, path == "/v1/chat/completions"
        if scope["method"] == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            try:
                req = json.loads(body)
            except ValueError:
                req = None
            if isinstance(req, dict):
                rw = rewrite(req, quality=self.quality, seed=self.seed, chat=chat)
                body, marker = json.dumps(rw.body).encode(), rw.marker
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        url = self.upstream + path + (("?" + scope["query_string"].decode()) if scope.get("query_string") else "")
        upstream_req = self.client.build_request(scope["method"], url, headers=headers, content=body)
        # a client that leaves (the gateway cancelling an attempt, the bench at its drain's end) cancels the relay;
        # closing the half-read answer then closes its connection, so vLLM aborts the request as the sim does
        await run_until_disconnect(lambda out: self._relay(upstream_req, marker, chat, out), receive, send)

    async def _relay(self, upstream_req: httpx.Request, marker: str | None, chat: bool, send: Any) -> None:
        try:
            resp = await self.client.send(upstream_req, stream=True)
        except httpx.HTTPError as exc:
            await _reply(send, 502, json.dumps({"error": {"message": f"upstream: {exc}"}}).encode())
            return
        try:
            out_headers = [(k, v) for k, v in resp.headers.raw if k.lower() not in _HOP]
            await send({"type": "http.response.start", "status": resp.status_code, "headers": out_headers})
            if marker is None or resp.status_code != 200:
                async for chunk in resp.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            elif resp.headers.get("content-type", "").startswith("text/event-stream"):
                async for chunk in _patched_sse(resp.aiter_raw(), marker, chat):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            else:
                obj = json.loads(await resp.aread())
                _patch(obj, marker, chat, stream=False)
                await send({"type": "http.response.body", "body": json.dumps(obj).encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await resp.aclose()


async def _patched_sse(chunks: AsyncIterator[bytes], marker: str, chat: bool) -> AsyncIterator[bytes]:
    buf = b""
    async for chunk in chunks:
        buf += chunk
        *events, buf = buf.split(b"\n\n")
        out = [b"data: " + patch_event(e[6:], marker, chat) if e.startswith(b"data: ") else e for e in events]
        if out:
            yield b"".join(e + b"\n\n" for e in out)
    if buf:
        yield buf


async def _reply(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from router.core.profile import load_profile
    from router.wire import SERVER_OPTIONS

    p = argparse.ArgumentParser(prog="python -m chimera_bench.simfields", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="the vLLM worker, http://host:port")
    p.add_argument("--profile", required=True, help="sim profile whose quality draws the verdicts")
    p.add_argument("--seed", type=int, default=0, help="the sim seed the verdicts follow")
    args = p.parse_args(argv)
    app = SimFieldsProxy(args.upstream, quality=load_profile(args.profile).quality, seed=args.seed)
    # served as the gateway is: its idle connections kept longer than the gateway keeps its worker connections
    uvicorn.run(app, host=args.host, port=args.port, **SERVER_OPTIONS)


if __name__ == "__main__":
    main()
