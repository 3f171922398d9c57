"""A small multi-agent app on chimera-router: planner -> coder -> reviewer, with the plain openai SDK.

Each agent is its own OpenAI client with its own API key, so the gateway knows who is asking and
applies that agent's models, SLA and priority. The model is "auto": the router picks it. Copy this
file as a starting point; nothing in it is specific to chimera beyond the base URL and the keys.

    export PLANNER_KEY=... CODER_KEY=... REVIEWER_KEY=...     # the keys in examples/multi-agent.yaml
    chimera serve --config examples/multi-agent.yaml &
    python examples/multi_agent_app.py "a command-line todo list"

CHIMERA_URL overrides the gateway's address (default http://127.0.0.1:8090/v1). Against the
simulated workers the "text" is placeholder words, but the flow, the timing and the routing
(the X-Chimera-Backend header) are real.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import openai
from openai import AsyncOpenAI

BASE_URL = os.environ.get("CHIMERA_URL", "http://127.0.0.1:8090/v1")
MAX_REVIEWS = 3


def agent_client(env_var: str) -> AsyncOpenAI:
    key = os.environ.get(env_var)
    if not key:
        sys.exit(f"set {env_var} to the agent's API key (see examples/multi-agent.yaml)")
    return AsyncOpenAI(base_url=BASE_URL, api_key=key, max_retries=2)


async def ask(client: AsyncOpenAI, name: str, messages: list[dict[str, str]], max_tokens: int) -> str:
    """One streamed step; prints who answered and how fast."""
    start = time.monotonic()
    first = None
    parts: list[str] = []
    stream = await client.chat.completions.create(model="auto", messages=messages, max_tokens=max_tokens,
                                                  stream=True)  # fmt: skip
    model = "?"
    async for chunk in stream:
        model = chunk.model or model
        for choice in chunk.choices:
            if choice.delta.content:
                first = first or time.monotonic()
                parts.append(choice.delta.content)
    text = "".join(parts)
    ttft = (first or time.monotonic()) - start
    print(f"[{name:<8}] {model:<14} ttft {ttft * 1000:6.0f} ms  total {time.monotonic() - start:5.2f} s  "
          f"{len(text.split())} words")  # fmt: skip
    return text


async def build(task: str) -> bool:
    planner, coder, reviewer = agent_client("PLANNER_KEY"), agent_client("CODER_KEY"), agent_client("REVIEWER_KEY")
    system = {"role": "system", "content": "You are one agent of a small software team. Do only your part."}
    transcript: list[dict[str, str]] = [system, {"role": "user", "content": f"Task: {task}"}]

    plan = await ask(planner, "planner", [*transcript, {"role": "user", "content": "Write a short plan."}], 300)
    transcript.append({"role": "assistant", "content": f"planner: {plan}"})
    for attempt in range(1, MAX_REVIEWS + 1):
        code = await ask(coder, "coder", [*transcript, {"role": "user", "content": "Write the code."}], 1500)
        transcript.append({"role": "assistant", "content": f"coder: {code}"})
        review = await ask(reviewer, "reviewer",
                           [*transcript, {"role": "user", "content": "Review the code. Approve or ask for changes."}],
                           300)  # fmt: skip
        transcript.append({"role": "assistant", "content": f"reviewer: {review}"})
        # A real reviewer would say "approved"; the simulated workers end answers with [correct]/[wrong].
        if review.rstrip().endswith(("[correct]", "approved")):
            print(f"approved after {attempt} round(s)")
            return True
    print(f"not approved after {MAX_REVIEWS} rounds")
    return False


if __name__ == "__main__":
    try:
        asyncio.run(build(" ".join(sys.argv[1:]) or "a command-line todo list"))
    except (openai.AuthenticationError, openai.APIConnectionError) as exc:
        sys.exit(f"{BASE_URL}: {exc}")
