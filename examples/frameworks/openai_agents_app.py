"""A multi-agent app on chimera-router with the OpenAI Agents SDK, on its default settings (the Responses API).

A planner hands the task off to a coder, which runs a tool (the two streamed); a reviewer then reads the
coder's answer.

Each agent is its own model client with its own API key, so the gateway applies that agent's models,
SLA and priority; the model is "auto": the router picks the worker.

    export PLANNER_KEY=... CODER_KEY=... REVIEWER_KEY=...     # the keys in examples/multi-agent.yaml
    chimera serve --config examples/multi-agent.yaml &
    pip install openai-agents
    python examples/frameworks/openai_agents_app.py "a command-line todo list"

CHIMERA_URL overrides the gateway's address (default http://127.0.0.1:8090/v1). Against the simulated
workers the text is placeholder words, but the handoff, the tool call and its arguments (drawn from the
tool's schema) and the routing are real. The coder asks for a tool call on its first turn
(``tool_choice="required"``; the SDK resets it after the call, so the next turn answers in text).
"""

from __future__ import annotations

import asyncio
import os
import sys

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

BASE_URL = os.environ.get("CHIMERA_URL", "http://127.0.0.1:8090/v1")


def model_for(env_var: str) -> OpenAIResponsesModel:
    """The agent's own client: its key tells the gateway which agent is asking."""
    key = os.environ.get(env_var)
    if not key:
        sys.exit(f"set {env_var} to the agent's API key (see examples/multi-agent.yaml)")
    return OpenAIResponsesModel(model="auto", openai_client=AsyncOpenAI(base_url=BASE_URL, api_key=key))


@function_tool
def run_tests(module: str, verbose: bool = False) -> str:
    """Run the test suite of one module of the project.

    Args:
        module: the module's name.
        verbose: list every test, not only the failures.
    """
    print(f"tool run_tests(module={module!r}, verbose={verbose})")
    return f"{module}: 12 passed"


async def main(task: str) -> int:
    set_tracing_disabled(True)  # traces go to OpenAI's platform by default; this app talks to its own gateway
    coder = Agent(
        name="coder",
        handoff_description="writes the code and runs its tests",
        instructions="Write the code for the plan, then run its tests with the run_tests tool.",
        tools=[run_tests],
        model=model_for("CODER_KEY"),
        model_settings=ModelSettings(tool_choice="required"),
    )
    planner = Agent(
        name="planner",
        instructions="Break the task into steps, then hand it to the coder.",
        handoffs=[coder],
        model=model_for("PLANNER_KEY"),
    )
    reviewer = Agent(
        name="reviewer",
        instructions="Review the code. Say APPROVED or list the changes needed.",
        model=model_for("REVIEWER_KEY"),
    )
    built = Runner.run_streamed(planner, task, max_turns=6)  # the handoff and the tool call, as events
    async for event in built.stream_events():
        if event.type == "run_item_stream_event" and event.name in ("handoff_occured", "tool_called"):
            print(f"event {event.name}")
    print(f"[{built.last_agent.name}] {built.final_output}")
    review = await Runner.run(reviewer, f"Task: {task}\n\nCode:\n{built.final_output}")
    print(f"[{review.last_agent.name}] {review.final_output}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(" ".join(sys.argv[1:]) or "a command-line todo list")))
