"""Agent frameworks nobody here wrote, each running a multi-agent app with a tool through the gateway
unchanged (examples/frameworks/), against the simulated workers: every agent's requests reach the gateway
under that agent's key, the tool loop runs (the sim calls tools as vLLM's hermes parser returns them), and
no request fails."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.clients.conftest import Gateway, tool_env

pytestmark = pytest.mark.slow
APPS = Path(__file__).resolve().parents[2] / "examples" / "frameworks"


def check_run(proc: subprocess.CompletedProcess[str], rows: list[Any], endpoint: str) -> Counter[str]:
    """What every app must show; returns the number of requests each agent made."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "tool run_tests(module=" in proc.stdout  # the framework ran the tool with the arguments the model wrote
    assert "[reviewer]" in proc.stdout
    assert rows and all(r["status"] == 200 and r["outcome"] == "ok" for r in rows), rows
    assert {r["endpoint"] for r in rows} == {endpoint}
    assert {r["backend"] for r in rows} <= {"small-0", "large-0"}
    assert rows[0]["agent"] == "planner"
    return Counter(r["agent"] for r in rows)


def test_openai_agents_sdk_on_its_defaults_uses_the_responses_api(gateway: Gateway) -> None:
    proc, rows = gateway.run([sys.executable, str(APPS / "openai_agents_app.py"), "a todo list"])
    agents = check_run(proc, rows, "responses")
    assert agents["planner"] == 1  # its one turn: the handoff to the coder
    assert agents["coder"] == 2  # the tool call, then the answer after the tool's result
    assert agents["reviewer"] == 1
    assert [r["stream"] for r in rows] == [True, True, True, False]  # the handoff and the tool loop streamed
    assert "event handoff_occured" in proc.stdout and "event tool_called" in proc.stdout and "[coder]" in proc.stdout


def test_langgraph_with_langchain_openai(gateway: Gateway) -> None:
    proc, rows = gateway.run([sys.executable, str(APPS / "langgraph_app.py"), "a todo list"])
    agents = check_run(proc, rows, "chat")
    assert agents == {"planner": 1, "coder": 2, "reviewer": 1}  # the coder's loop: tool calls, then text


def test_autogen_agentchat_round_robin_team(gateway: Gateway) -> None:
    proc, rows = gateway.run([sys.executable, str(APPS / "autogen_app.py"), "a todo list"])
    agents = check_run(proc, rows, "chat")
    assert set(agents) == {"planner", "coder", "reviewer"}
    assert "ToolCallRequestEvent" in proc.stdout and "tool results" in proc.stdout


@pytest.mark.timeout(900)
def test_crewai_sequential_crew(gateway: Gateway) -> None:
    python = tool_env("crewai") / "python"
    proc, rows = gateway.run([str(python), str(APPS / "crewai_app.py"), "a todo list"], timeout_s=180)
    agents = check_run(proc, rows, "chat")
    assert agents["planner"] == 1 and agents["reviewer"] == 1
    assert agents["coder"] >= 2  # the tool call, then the answer after the tool's result
