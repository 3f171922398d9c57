"""A small multi-agent app on chimera-router: planner -> coder -> reviewer, with the plain openai SDK.

Each agent is its own OpenAI client with its own API key, so the gateway knows who is asking and
applies that agent's models, SLA and priority. The model is "auto": the router picks it. Copy this
file as a starting point; nothing in it is specific to chimera beyond the base URL and the keys.

    export PLANNER_KEY=... CODER_KEY=... REVIEWER_KEY=...     # the keys in examples/multi-agent.yaml
    chimera serve --config examples/multi-agent.yaml &
    python examples/multi_agent_app.py "a command-line todo list"
    python examples/multi_agent_app.py --sim "a command-line todo list"   # on the simulated workers

CHIMERA_URL overrides the gateway's address (default http://127.0.0.1:8090/v1). Against the
simulated workers the "text" is placeholder words, but the flow, the timing and the routing (the
worker in the X-Chimera-Backend header) are real. A simulated reviewer gives a verdict, `[correct]`
or `[wrong]` at the end of its answer, only when the request says how hard the task is (the
simulator's `sim.difficulty` field): `--sim` sends it; a real model just ignores that field's absence.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from typing import Any

import openai
from openai import AsyncOpenAI

BASE_URL = os.environ.get("CHIMERA_URL", "http://127.0.0.1:8090/v1")
MAX_REVIEWS = 3
APPROVED = re.compile(r"\bapproved?\b|\[correct\]", re.IGNORECASE)  # a real reviewer's word, or the sim's verdict
CHANGES = re.compile(r"\b(not approved|changes? (are )?(needed|requested)|reject(ed)?)\b|\[wrong\]", re.IGNORECASE)


def agent_client(env_var: str) -> AsyncOpenAI:
    key = os.environ.get(env_var)
    if not key:
        sys.exit(f"set {env_var} to the agent's API key (see examples/multi-agent.yaml)")
    return AsyncOpenAI(base_url=BASE_URL, api_key=key, max_retries=2)


async def ask(client: AsyncOpenAI, name: str, messages: list[dict[str, str]], max_tokens: int,
              extra: dict[str, Any] | None = None) -> str:  # fmt: skip
    """One streamed step; prints which worker answered (the gateway's X-Chimera-Backend) and how fast."""
    start = time.monotonic()
    first = None
    parts: list[str] = []
    finish = None
    raw = await client.chat.completions.with_raw_response.create(
        model="auto", messages=messages, max_tokens=max_tokens, stream=True, extra_body=extra
    )
    worker = raw.headers.get("x-chimera-backend", "?")
    async for chunk in raw.parse():
        for choice in chunk.choices:
            if choice.delta.content:
                first = first or time.monotonic()
                parts.append(choice.delta.content)
            finish = choice.finish_reason or finish
    text = "".join(parts)
    ttft = (first or time.monotonic()) - start
    cut = "  (cut off at max_tokens)" if finish == "length" else ""
    print(f"[{name:<8}] {worker:<10} ttft {ttft * 1000:6.0f} ms  total {time.monotonic() - start:5.2f} s  "
          f"{len(text.split())} words{cut}")  # fmt: skip
    return text


def approved(review: str) -> bool:
    """The reviewer's verdict, read from its last line: approval unless it asks for changes."""
    lines = [ln for ln in review.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return bool(APPROVED.search(last)) and not CHANGES.search(last)


async def build(task: str, sim: bool) -> bool:
    planner, coder, reviewer = agent_client("PLANNER_KEY"), agent_client("CODER_KEY"), agent_client("REVIEWER_KEY")
    system = {"role": "system", "content": "You are one agent of a small software team. Do only your part."}
    transcript: list[dict[str, str]] = [system, {"role": "user", "content": f"Task: {task}"}]
    verdict = {"sim": {"difficulty": 0.3}} if sim else None

    plan = await ask(planner, "planner", [*transcript, {"role": "user", "content": "Write a short plan."}], 300)
    transcript.append({"role": "assistant", "content": f"planner: {plan}"})
    for attempt in range(1, MAX_REVIEWS + 1):
        code = await ask(coder, "coder", [*transcript, {"role": "user", "content": "Write the code."}], 1500)
        transcript.append({"role": "assistant", "content": f"coder: {code}"})
        ask_review = {"role": "user", "content": "Review the code. End with one line: APPROVED or CHANGES NEEDED."}
        review = await ask(reviewer, "reviewer", [*transcript, ask_review], 300, verdict)
        transcript.append({"role": "assistant", "content": f"reviewer: {review}"})
        if approved(review):
            print(f"approved after {attempt} round(s)")
            return True
    print(f"not approved after {MAX_REVIEWS} rounds")
    return False


def main(argv: list[str]) -> int:
    sim = "--sim" in argv
    task = " ".join(a for a in argv if a != "--sim") or "a command-line todo list"
    try:
        return 0 if asyncio.run(build(task, sim)) else 1
    except openai.APIStatusError as exc:  # 401 bad key, 429 overloaded, 503 no healthy worker, ...
        print(f"{BASE_URL}: {exc.status_code} {exc.message}", file=sys.stderr)
    except openai.APIError as exc:  # the gateway unreachable, or a stream that broke mid-way
        print(f"{BASE_URL}: {exc.message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
