"""Fuzzing the gateway's HTTP surface: hostile bodies, headers, methods and paths, in process
(``TestClient`` over the ASGI app, a MockTransport worker) for volume. Every answer must be below
500, and every error OpenAI's envelope. The loopback and disconnect cases are in test_fuzz_wire."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from starlette.applications import Starlette
from starlette.testclient import TestClient

from router.app import create_app
from tests.conftest import make_config
from tests.reliability.fastworker import fast_client
from tests.reliability.fuzzing import KEYS, FuzzRequest, envelope_problem, fuzz_requests, variants

MAX_BODY = 64 * 1024


def fuzz_config(policy: str, **gateway: Any) -> Any:
    backends = [
        {"name": "w-small", "url": "http://w-small.invalid:8000", "model": "m-small"},
        {"name": "w-big", "url": "http://w-big.invalid:8000", "model": "m-big"},
    ]
    agents = [
        {"name": "planner", "api_keys": [KEYS["planner"]], "models": ["m-small", "m-big"]},
        {"name": "coder", "api_keys": [KEYS["coder"]], "models": ["m-big"]},
    ]
    return make_config(backends, agents, policy=policy, max_body_bytes=MAX_BODY, **gateway)


def check_answer(req: FuzzRequest, r: httpx.Response) -> None:
    assert r.status_code < 500, f"{req.method} {req.path} {req.body[:200]!r} -> {r.status_code} {r.content[:300]!r}"
    problem = envelope_problem(r)
    assert problem is None, f"{req.method} {req.path} {req.body[:200]!r}: {problem}"
    if r.status_code == 200 and req.path in ("/v1/chat/completions", "/v1/completions"):
        if r.headers["content-type"].startswith("text/event-stream"):
            assert r.content.endswith(b"data: [DONE]\n\n"), r.content[-200:]
        else:
            json.loads(r.content)


@pytest.fixture(params=["predictive", "least_outstanding"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestClient]:
    cfg = fuzz_config(request.param, request_log=str(tmp_path / "requests.jsonl"), admin_key="adm-fuzz")
    with TestClient(create_app(cfg, http_client=fast_client(), probe=False), raise_server_exceptions=False) as c:
        yield c


def warm_up(client: TestClient) -> None:
    """One good request, so that /ready (a worker has answered) is 200 like in any running gateway."""
    auth = {"authorization": f"Bearer {KEYS['planner']}"}
    r = client.post("/v1/completions", json={"model": "auto", "prompt": "hi"}, headers=auth)
    assert r.status_code == 200, r.text


def fuzz(client: TestClient, examples: int) -> int:
    warm_up(client)
    sent = [0]

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )
    @given(fuzz_requests())
    def one(req: FuzzRequest) -> None:
        r = client.request(req.method, req.path, headers=list(req.headers), content=req.body)
        sent[0] += 1
        check_answer(req, r)

    one()
    return sent[0]


def test_fuzzed_requests_never_5xx_and_errors_are_envelopes(client: TestClient) -> None:
    assert fuzz(client, 750) >= 750  # x2 policies: 1,500 in the default run


def collect(examples: int) -> list[FuzzRequest]:
    """``examples`` requests drawn by Hypothesis (generation only: the volume run does not shrink;
    a failure names the request)."""
    out: list[FuzzRequest] = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    @given(fuzz_requests())
    def draw(req: FuzzRequest) -> None:
        out.append(req)

    draw()
    return out


@contextlib.asynccontextmanager
async def in_process(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on the app through ASGITransport, with the app's lifespan running (its state
    handed to every request the way uvicorn does)."""
    async with app.router.lifespan_context(app) as state:

        async def with_state(scope: Any, receive: Any, send: Any) -> None:
            scope["state"] = dict(state or {})
            await app(scope, receive, send)

        transport = httpx.ASGITransport(app=with_state)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield client


@pytest.mark.slow
async def test_fuzz_ten_thousand(tmp_path: Path) -> None:
    requests = [v for req in collect(3_200) for v in variants(req)]
    t0 = time.perf_counter()
    cfg = fuzz_config("predictive", request_log=str(tmp_path / "requests.jsonl"), admin_key="adm-fuzz")
    app = create_app(cfg, http_client=fast_client(), probe=False)
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    async with in_process(app) as client:
        r = await client.post(
            "/v1/completions",
            json={"model": "auto", "prompt": "hi"},
            headers={"authorization": f"Bearer {KEYS['planner']}"},
        )
        assert r.status_code == 200
        sem = asyncio.Semaphore(16)

        async def send(req: FuzzRequest) -> None:
            async with sem:
                r = await client.request(req.method, req.path, headers=list(req.headers), content=req.body)
            statuses[r.status_code] += 1
            try:
                check_answer(req, r)
            except AssertionError as exc:
                failures.append(str(exc))

        await asyncio.gather(*(send(q) for q in requests))
    took = time.perf_counter() - t0
    print(f"fuzz: {sum(statuses.values())} requests in {took:.1f} s; statuses {sorted(statuses.items())}")
    assert sum(statuses.values()) >= 10_000
    assert not failures, f"{len(failures)} bad answers, e.g. {failures[:3]}"
    assert statuses[200] > 500 and statuses[400] > 1000  # the mix reaches the workers and the validators
