"""A multi-agent app on chimera-router with LangGraph and langchain-openai.

A graph of three agents: the planner writes a plan, the coder (a tool loop of its own: model, tools,
model) writes the code and runs its tests, the reviewer reads the result. Each agent is its own
``ChatOpenAI`` with its own API key, so the gateway applies that agent's models, SLA and priority; the
model is "auto": the router picks the worker.

    export PLANNER_KEY=... CODER_KEY=... REVIEWER_KEY=...     # the keys in examples/multi-agent.yaml
    chimera serve --config examples/multi-agent.yaml &
    pip install langgraph langchain-openai
    python examples/frameworks/langgraph_app.py "a command-line todo list"

CHIMERA_URL overrides the gateway's address (default http://127.0.0.1:8090/v1). Against the simulated
workers the text is placeholder words, but the tool calls, their arguments (drawn from the tool's
schema) and the routing are real.
"""

from __future__ import annotations

import os
import sys
from typing import TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

BASE_URL = os.environ.get("CHIMERA_URL", "http://127.0.0.1:8090/v1")


def llm_for(env_var: str) -> ChatOpenAI:
    """The agent's own client: its key tells the gateway which agent is asking."""
    key = os.environ.get(env_var)
    if not key:
        sys.exit(f"set {env_var} to the agent's API key (see examples/multi-agent.yaml)")
    return ChatOpenAI(model="auto", base_url=BASE_URL, api_key=key)


@tool
def run_tests(module: str, verbose: bool = False) -> str:
    """Run the test suite of one module of the project.

    Args:
        module: the module's name.
        verbose: list every test, not only the failures.
    """
    print(f"tool run_tests(module={module!r}, verbose={verbose})")
    return f"{module}: 12 passed"


class Team(TypedDict, total=False):
    task: str
    plan: str
    code: str
    review: str


def coder_graph() -> object:
    """The coder's own loop: the model asks for tool calls, the tools answer, until it answers in text."""
    model = llm_for("CODER_KEY").bind_tools([run_tests])
    g = StateGraph(MessagesState)
    g.add_node("model", lambda s: {"messages": [model.invoke(s["messages"])]})
    g.add_node("tools", ToolNode([run_tests]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition)
    g.add_edge("tools", "model")
    return g.compile()


def build() -> object:
    planner, reviewer, coder = llm_for("PLANNER_KEY"), llm_for("REVIEWER_KEY"), coder_graph()

    def plan(s: Team) -> Team:
        out = planner.invoke([SystemMessage("Break the task into steps."), HumanMessage(s["task"])])
        print(f"[planner] {out.content}")
        return {"plan": str(out.content)}

    def code(s: Team) -> Team:
        asked = [SystemMessage("Write the code, then run its tests."), HumanMessage(f"Plan:\n{s['plan']}")]
        out = coder.invoke({"messages": asked})  # type: ignore[attr-defined]
        print(f"[coder] {out['messages'][-1].content}")
        return {"code": str(out["messages"][-1].content)}

    def review(s: Team) -> Team:
        out = reviewer.invoke([SystemMessage("Say APPROVED or list the changes needed."), HumanMessage(s["code"])])
        print(f"[reviewer] {out.content}")
        return {"review": str(out.content)}

    g = StateGraph(Team)
    for name, fn in (("planner", plan), ("coder", code), ("reviewer", review)):
        g.add_node(name, fn)
    g.add_edge(START, "planner")
    g.add_edge("planner", "coder")
    g.add_edge("coder", "reviewer")
    g.add_edge("reviewer", END)
    return g.compile()


if __name__ == "__main__":
    build().invoke({"task": " ".join(sys.argv[1:]) or "a command-line todo list"})  # type: ignore[attr-defined]
