"""Running engine requests for an HTTP handler: submit them, abort them when the client leaves or the
handler is cancelled, and follow their tokens as the engine releases them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from backends.sim.choices import abort_on_disconnect
from backends.sim.engine import Engine, Request, Status
from router.core.asgi import Receive


@contextlib.asynccontextmanager
async def running(engine: Engine, reqs: Sequence[Request], receive: Receive, stream: bool) -> AsyncIterator[None]:
    """``reqs`` in the engine for the block's duration; a client that hangs up aborts them."""
    for r in reqs:
        r.notify_each = stream
    watcher = asyncio.create_task(abort_on_disconnect(engine, list(reqs), receive))
    for r in reqs:
        engine.submit(r)
    try:
        yield
    finally:
        watcher.cancel()
        for r in reqs:
            engine.abort(r)  # no-ops unless the handler itself was cancelled


async def finished(reqs: Sequence[Request]) -> bool:
    """Wait for every request; whether all finished (none was aborted)."""
    for r in reqs:
        while not r.done:
            await r.wait_for_output(len(r.output))
    return all(r.status is Status.FINISHED for r in reqs)
