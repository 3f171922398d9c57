"""Schemathesis over the gateway's own /openapi.json, in front of a simulated worker: every operation, bodies
and headers drawn from the published schemas (and their violations), real HTTP on loopback.

Checked on every answer: no 5xx, every status documented, every body and header as the schema says. Not
checked: that every schema-valid body is accepted — a valid body may still ask for the impossible (a model
that does not exist, a prompt longer than the worker's context), which the gateway answers 4xx as it should.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from router.core.config import Config
from router.openapi import openapi_document
from tests.conftest import ServerThread, make_config


def _config(url: str) -> Config:
    return make_config([{"name": "w", "url": url, "model": "m"}], max_body_bytes=64 * 1024)


# the document /openapi.json serves for this config (it depends on the config, not on the worker's address)
schema = schemathesis.openapi.from_dict(openapi_document(_config("http://127.0.0.1:1")))
schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    from backends.sim.server import SimSettings
    from backends.sim.server import create_app as sim_app
    from router.app import create_app
    from router.wire import HeadFirstProtocol

    with ServerThread(sim_app(SimSettings(model="m", profile="h200-qwen2.5-0.5b", speedup=50.0))) as sim:
        config = _config(sim.url)
        with ServerThread(create_app(config), http=HeadFirstProtocol) as gw:
            assert httpx.get(gw.url + "/openapi.json").json() == openapi_document(config)
            yield gw.url


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_every_operation_answers_as_documented(case: Any, gateway_url: str) -> None:
    case.call_and_validate(base_url=gateway_url, excluded_checks=[positive_data_acceptance])
