"""The stack's floor: what serving a proxied request costs in Python with the gateway's own parts and nothing else.

A bare ASGI app under uvicorn (uvloop, httptools: the gateway's server) that reads the request body, POSTs it
through one pooled aiohttp session (the gateway's worker client) to ``FLOOR_WORKER`` and relays the answer's
status, content type and body as they arrive. No routing, no validation, no accounting: the overhead workload runs
it as the row ``floor`` (``--peers floor``), so a table shows how much of the gateway's added latency and CPU is
the server and client it is built on, and how much is its own.

    FLOOR_WORKER=http://127.0.0.1:8001 python -m chimera_bench.floorproxy --port 9000
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import aiohttp
import uvicorn

WORKER_ENV = "FLOOR_WORKER"


class FloorProxy:
    def __init__(self, worker: str) -> None:
        self.worker = worker.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        assert self.session is not None
        if scope["method"] == "GET":  # GET /health (and anything else): the bench's readiness check
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {"content-type": "application/json"}
        async with self.session.post(self.worker + scope["path"], data=body, headers=headers) as answer:
            kind = answer.headers.get("content-type", "application/json").encode()
            await send({"type": "http.response.start", "status": answer.status, "headers": [(b"content-type", kind)]})
            content = answer.content
            while chunk := await content.readany():
                await send({"type": "http.response.body", "body": chunk, "more_body": not content.at_eof()})
                if content.at_eof():
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                connector = aiohttp.TCPConnector(limit=4096, limit_per_host=0, keepalive_timeout=4.0)
                self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m chimera_bench.floorproxy")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    args = p.parse_args()
    app = FloorProxy(os.environ[WORKER_ENV])
    uvicorn.run(app, host=args.host, port=args.port, loop="uvloop", http="httptools", access_log=False,
                log_level="warning", lifespan="on")  # fmt: skip


if __name__ == "__main__":
    main()
