"""Benchmark clients nobody here wrote, run against the gateway on their defaults plus a local tokenizer (the
simulated workers' own, backends/sim/hftokenizer.py): each takes `auto`, the first entry of /v1/models, so its
requests go through the router and spread over the workers, and every prompt is as long in the sim's usage as
the client made it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from backends.sim import hftokenizer
from tests.clients.conftest import KEYS, Gateway, tool_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
PROMPT, OUTPUT, REQUESTS = 256, 64, 40


def check_rows(rows: list[Any], agent: str, prompt_tokens: int) -> None:
    assert len(rows) == REQUESTS
    assert all(r["status"] == 200 and r["outcome"] == "ok" and r["agent"] == agent for r in rows)
    assert {r["requested_model"] for r in rows} == {"auto"}  # what the client found first in /v1/models
    assert set(Counter(r["backend"] for r in rows)) == {"small-0", "large-0"}  # routed, not pinned to one worker
    assert {r["prompt_tokens"] for r in rows} == {prompt_tokens + 1}  # the client's length, plus the sim's role word


def test_guidellm(gateway: Gateway, tmp_path: Path) -> None:
    hftokenizer.write(tmp_path / "tokenizer")
    out = tmp_path / "guidellm.json"
    proc, rows = gateway.run([
        str(tool_env("guidellm") / "guidellm"), "run",
        "--backend", f"kind=openai_http,target={gateway.url},api_key={KEYS['PLANNER_KEY']}",
        "--tokenizer", f"kind=hf_auto,model={tmp_path / 'tokenizer'}",
        "--data", f"kind=synthetic_text,prompt_tokens={PROMPT},output_tokens={OUTPUT}",
        "--profile", "kind=constant,rate=20", "--constraint", f"kind=max_requests,count={REQUESTS}",
        "--output", f"kind=json,path={out}", "--disable-console-interactive",
    ], timeout_s=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    requests = json.loads(out.read_text())["benchmarks"][0]["requests"]
    assert (len(requests["successful"]), len(requests["errored"]), len(requests["incomplete"])) == (REQUESTS, 0, 0)
    assert {r["output_tokens"] for r in requests["successful"]} == {OUTPUT}
    check_rows(rows, "planner", PROMPT)


def test_aiperf(gateway: Gateway, tmp_path: Path) -> None:
    hftokenizer.write(tmp_path / "tokenizer")
    proc, rows = gateway.run([
        str(tool_env("aiperf") / "aiperf"), "profile", "--model", "auto", "--url", gateway.url,
        "--api-key", KEYS["CODER_KEY"], "--tokenizer", str(tmp_path / "tokenizer"),
        "--synthetic-input-tokens-mean", str(PROMPT), "--output-tokens-mean", str(OUTPUT),
        "--request-count", str(REQUESTS), "--concurrency", "4", "--ui-type", "none",
        "--artifact-dir", str(tmp_path / "aiperf"),
    ], timeout_s=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    [export] = (tmp_path / "aiperf").rglob("profile_export_aiperf.json")
    summary = json.loads(export.read_text())
    assert summary["request_count"]["avg"] == REQUESTS and not summary.get("error_summary")
    assert summary["input_sequence_length"]["min"] == summary["input_sequence_length"]["max"] == PROMPT
    check_rows(rows, "coder", PROMPT)
