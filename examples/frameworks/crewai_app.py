"""A multi-agent app on chimera-router with CrewAI.

A sequential crew of three agents: the planner writes a plan, the coder runs the project's tests with a
tool, the reviewer reads the result. Each agent is its own ``LLM`` with its own API key, so the gateway
applies that agent's models, SLA and priority; the model is "auto": the router picks the worker.

    export PLANNER_KEY=... CODER_KEY=... REVIEWER_KEY=...     # the keys in examples/multi-agent.yaml
    chimera serve --config examples/multi-agent.yaml &
    pip install crewai
    python examples/frameworks/crewai_app.py "a command-line todo list"

CHIMERA_URL overrides the gateway's address (default http://127.0.0.1:8090/v1). Against the simulated
workers the text is placeholder words, but the tool calls, their arguments (drawn from the tool's
schema) and the routing are real.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # CrewAI reports usage to its servers by default
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from crewai import LLM, Agent, Crew, Process, Task
from crewai.tools import tool

BASE_URL = os.environ.get("CHIMERA_URL", "http://127.0.0.1:8090/v1")


def llm_for(env_var: str) -> LLM:
    """The agent's own client: its key tells the gateway which agent is asking."""
    key = os.environ.get(env_var)
    if not key:
        sys.exit(f"set {env_var} to the agent's API key (see examples/multi-agent.yaml)")
    return LLM(model="openai/auto", base_url=BASE_URL, api_key=key)


@tool("run_tests")
def run_tests(module: str, verbose: bool = False) -> str:
    """Run the test suite of one module of the project (verbose: list every test, not only the failures)."""
    print(f"tool run_tests(module={module!r}, verbose={verbose})")
    return f"{module}: 12 passed"


def main(task: str) -> int:
    planner = Agent(role="planner", goal="Break the task into steps", backstory="A lead engineer.",
                    llm=llm_for("PLANNER_KEY"), allow_delegation=False)  # fmt: skip
    coder = Agent(role="coder", goal="Write the code and run its tests", backstory="A careful developer.",
                  llm=llm_for("CODER_KEY"), tools=[run_tests], allow_delegation=False)  # fmt: skip
    reviewer = Agent(role="reviewer", goal="Approve the code or list the changes needed", backstory="A reviewer.",
                     llm=llm_for("REVIEWER_KEY"), allow_delegation=False)  # fmt: skip
    crew = Crew(
        agents=[planner, coder, reviewer],
        tasks=[
            Task(description=f"Plan: {task}", expected_output="the steps", agent=planner),
            Task(description="Write the code, then run its tests.", expected_output="the code", agent=coder),
            Task(description="Review the code.", expected_output="APPROVED or the changes", agent=reviewer),
        ],
        process=Process.sequential,
    )
    result = crew.kickoff()
    for out in result.tasks_output:
        print(f"[{out.agent}] {out.raw[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(" ".join(sys.argv[1:]) or "a command-line todo list"))
