"""A multi-agent app on chimera-router with AutoGen AgentChat.

A round-robin team of three assistants: the planner writes a plan, the coder runs the project's tests
with a tool, the reviewer reads the result. Each agent is its own model client with its own API key,
so the gateway applies that agent's models, SLA and priority; the model is "auto": the router picks
the worker, so the client is told what such a model can do (``model_info``).

    export PLANNER_KEY=... CODER_KEY=... REVIEWER_KEY=...     # the keys in examples/multi-agent.yaml
    chimera serve --config examples/multi-agent.yaml &
    pip install autogen-agentchat 'autogen-ext[openai]'
    python examples/frameworks/autogen_app.py "a command-line todo list"

CHIMERA_URL overrides the gateway's address (default http://127.0.0.1:8090/v1). Against the simulated
workers the text is placeholder words, but the tool calls, their arguments (drawn from the tool's
schema) and the routing are real.
"""

from __future__ import annotations

import asyncio
import os
import sys
import warnings

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import ToolCallExecutionEvent
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core.models import ModelFamily, ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

BASE_URL = os.environ.get("CHIMERA_URL", "http://127.0.0.1:8090/v1")
AUTO = ModelInfo(vision=False, function_calling=True, json_output=True, family=ModelFamily.UNKNOWN,
                 structured_output=True)  # fmt: skip


def client_for(env_var: str) -> OpenAIChatCompletionClient:
    """The agent's own client: its key tells the gateway which agent is asking."""
    key = os.environ.get(env_var)
    if not key:
        sys.exit(f"set {env_var} to the agent's API key (see examples/multi-agent.yaml)")
    return OpenAIChatCompletionClient(model="auto", base_url=BASE_URL, api_key=key, model_info=AUTO)


async def run_tests(module: str, verbose: bool = False) -> str:
    """Run the test suite of one module of the project (verbose: list every test, not only the failures)."""
    print(f"tool run_tests(module={module!r}, verbose={verbose})")
    return f"{module}: 12 passed"


async def main(task: str) -> int:
    # The answer names the model the router chose (qwen2.5-7b, ...), not "auto"; AutoGen warns of each.
    warnings.filterwarnings("ignore", "Resolved model mismatch", UserWarning)
    clients = [client_for(v) for v in ("PLANNER_KEY", "CODER_KEY", "REVIEWER_KEY")]
    planner = AssistantAgent("planner", clients[0], system_message="Break the task into steps.")
    coder = AssistantAgent("coder", clients[1], tools=[run_tests], system_message="Run the tests of the plan's code.")
    reviewer = AssistantAgent("reviewer", clients[2], system_message="Say APPROVED or list the changes needed.")
    team = RoundRobinGroupChat([planner, coder, reviewer], termination_condition=MaxMessageTermination(5))
    try:
        result = await team.run(task=task)
    finally:
        for c in clients:
            await c.close()
    for m in result.messages:
        kind = "tool results" if isinstance(m, ToolCallExecutionEvent) else m.type
        print(f"[{m.source}] {kind}: {str(m.to_text())[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(" ".join(sys.argv[1:]) or "a command-line todo list")))
