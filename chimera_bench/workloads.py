"""Seeded multi-agent workloads: what each agent step asks, and the hidden ``sim`` fields it carries.

A workflow is a short conversation among agents. Every step is one chat request whose messages are
the team's shared transcript so far (system prompt, task, every earlier answer) plus the step's
own instruction, so contexts grow step by step and consecutive steps share a long prefix (which is
what makes prefix caching and cache-aware routing matter).

Each request carries ``sim = {"output_tokens": N, "difficulty": D}``, read only by the simulated
worker. N and D are drawn from the distributions below; they *correlate* with what the router can
see (the agent, the prompt's length, its words) without being readable from the request:

* **difficulty** — the task's topic word (``TOPICS``) sets a base difficulty; the task's own
  ``D = clip(base + N(0, 0.06), 0.02, 0.98)``. Harder tasks have longer specifications
  (``40 + 200·D + U(0, 60)`` words). Step difficulty follows the workflow: the planner gets
  ``0.6·D``; the coder/solver ``D`` (``+0.10`` after a wrong plan, ``-0.08`` per extra round);
  a tester/verifier ``0.4·D`` when the answer it checks was correct, else ``0.98`` (so a wrong
  answer seldom passes: the final verdict reflects the coder's/solver's model as well).
* **output tokens** — ``median_role · (1 + gain_role · D) · detail · exp(sigma_role · z)``, clipped to
  ``[4, 0.9 · max_tokens_role]``; ``detail`` is 0.6 / 1.0 / 1.5 as the task says "briefly" /
  nothing / "thoroughly" (probabilities 1/4, 1/2, 1/4). See ``ROLES`` for the per-role numbers.
* **chat** — 80 % short questions (prompt ~100-500 words), 20 % long documents to summarize
  (~3,000-8,000 words); topic words set the difficulty as above.

Workloads: ``codegen`` (planner → rounds of coder → tester until the tester's answer is
``[correct]``, at most 4 rounds), ``math`` (solver → verifier, at most 2 rounds), ``mixed`` (each
workflow codegen or math with equal odds), ``chat`` (one request). A workflow succeeds when its
last answer ends with ``[correct]`` (*strict*: and the answer that last check passed was itself
correct — a checker can pass a wrong answer). Everything is drawn from ``random.Random(f"{seed}:{index}")``:
the same seed and index give the same workflow whatever the arrival order.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

WORKLOADS = ("codegen", "math", "mixed", "chat")
CORRECT = "[correct]"


@dataclass(frozen=True)
class Role:
    max_tokens: int  # the request's cap (fixed per role, so it leaks nothing)
    median: float  # output tokens at difficulty 0, detail 1
    gain: float  # how much longer the answer gets per unit of difficulty
    sigma: float  # log-normal spread
    instruction: str  # the step's last user message


ROLES: dict[str, Role] = {
    "planner": Role(512, 90, 1.0, 0.30, "As the planner, write a short numbered plan for the coder."),
    "coder": Role(2048, 300, 1.5, 0.35, "As the coder, write the complete implementation with comments."),
    "tester": Role(512, 70, 0.5, 0.30, "As the tester, run the tests against this code and report."),
    "solver": Role(1536, 220, 1.5, 0.35, "As the solver, work through the problem step by step."),
    "verifier": Role(256, 40, 0.5, 0.30, "As the verifier, check the solution and give a verdict."),
    "chat": Role(1024, 120, 1.0, 0.50, "Answer the question."),
    "chat_long": Role(1024, 250, 0.5, 0.40, "Summarize the document above."),
}

TOPICS: dict[str, tuple[tuple[str, float], ...]] = {
    "codegen": (
        ("fizzbuzz", 0.10), ("palindrome", 0.15), ("csv", 0.25), ("sorting", 0.30), ("tokenizer", 0.40),
        ("json", 0.45), ("cache", 0.55), ("scheduler", 0.65), ("compiler", 0.80), ("consensus", 0.90),
    ),
    "math": (
        ("arithmetic", 0.10), ("fractions", 0.20), ("percentages", 0.25), ("algebra", 0.40), ("geometry", 0.50),
        ("probability", 0.60), ("combinatorics", 0.70), ("inequalities", 0.85), ("olympiad", 0.92),
    ),
    "chat": (
        ("weather", 0.10), ("recipes", 0.15), ("travel", 0.20), ("history", 0.35), ("finance", 0.45),
        ("law", 0.60), ("medicine", 0.70),
    ),
}  # fmt: skip

DETAIL = (("briefly", 0.6, 0.25), ("", 1.0, 0.5), ("thoroughly", 1.5, 0.25))  # word, length factor, probability

_WORDS = (
    "the a an of to and in for on with as by from at this that it is be are was will can should must "
    "data value list item function module class method input output result error test case file line "
    "number string table field record request response user system service client server state cache "
    "queue thread process memory time step loop check return call build run parse read write update "
    "first second next last each every other more most less small large simple fast slow safe correct "
    "when if then else while after before until because since so but or not only also just still "
    "make take give find keep show use handle store load send receive create remove merge split sort "
    "count sum total average ratio rate limit size length width height area angle point line circle "
    "prove assume suppose let given hence therefore equal greater smaller integer prime even odd "
    "weather rain morning city museum train budget market price contract patient doctor story"
).split()

MAX_CODE_ROUNDS, MAX_MATH_ROUNDS = 4, 2
_SYSTEM = {
    "codegen": "You are one agent of a software team of a planner, a coder and a tester. Read the "
    "transcript, do only your own part, and end your answer with your verdict.",
    "math": "You are one agent of a math team of a solver and a verifier. Read the transcript, do only "
    "your own part, and end your answer with your verdict.",
    "chat": "You are a helpful assistant. Answer clearly and end with your verdict.",
}


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(_WORDS, k=n))


# A fixed team preamble per workflow kind: every workflow of a kind shares it (a cacheable prefix).
_PREAMBLE = {kind: text + " " + _text(random.Random(f"preamble:{kind}"), 90) for kind, text in _SYSTEM.items()}


@dataclass(frozen=True)
class Step:
    """One request of a workflow: who sends it, what it says, and what only the sim may read."""

    agent: str
    messages: list[dict[str, str]]
    max_tokens: int
    output_tokens: int
    difficulty: float

    @property
    def sim(self) -> dict[str, Any]:
        return {"output_tokens": self.output_tokens, "difficulty": self.difficulty}

    @property
    def prompt_words(self) -> int:
        """Tokens as the simulated worker counts them (each message's role, then its words)."""
        return sum(1 + len(m["content"].split()) for m in self.messages)


@dataclass
class Workflow:
    """A workflow whose next step depends on the answers so far (a failed test asks for another round)."""

    id: str
    kind: str  # codegen | math | chat
    topic: str
    difficulty: float
    detail: str
    rng: random.Random
    long: bool = False  # chat: a long document
    transcript: list[dict[str, str]] = field(default_factory=list)
    steps: int = 0
    rounds: int = 0
    last_verdict: bool | None = None
    last_role: str | None = None
    plan_ok: bool = True
    last_ok: bool = True  # the coder's / solver's most recent answer
    done: bool = False

    def next_step(self) -> Step | None:
        if self.done:
            return None
        role = self._next_role()
        if role is None:
            self.done = True
            return None
        d = self._step_difficulty(role)
        spec = ROLES["chat_long" if self.long else role]
        detail_factor = next(f for w, f, _ in DETAIL if w == self.detail)
        z = self.rng.gauss(0.0, 1.0)
        natural = spec.median * (1.0 + spec.gain * self.difficulty) * detail_factor * math.exp(spec.sigma * z)
        out = int(min(max(4.0, natural), 0.9 * spec.max_tokens))
        instruction = spec.instruction + (f" Answer {self.detail}." if self.detail else "")
        messages = [{"role": "system", "content": _PREAMBLE[self.kind]}, *self.transcript]
        messages.append({"role": "user", "content": instruction})
        return Step("chat" if self.kind == "chat" else role, messages, spec.max_tokens, out, round(d, 3))

    def record(self, step: Step, text: str) -> None:
        """Fold an answer into the transcript and the workflow's state."""
        ok = text.rstrip().endswith(CORRECT)
        self.steps += 1
        self.last_verdict = ok
        role = step.agent
        self.last_role = role
        if role == "planner":
            self.plan_ok = ok
        elif role in ("coder", "solver"):
            self.last_ok = ok
            self.rounds += 1
        self.transcript.append({"role": "assistant", "content": f"{role}: {text}"})
        if role in ("tester", "verifier", "chat") and ok:
            self.done = True

    @property
    def succeeded(self) -> bool:
        return bool(self.last_verdict)

    @property
    def succeeded_strict(self) -> bool:
        """The last check passed an answer that was itself correct (a check can pass a wrong answer)."""
        return bool(self.last_verdict) and (self.kind == "chat" or self.last_ok)

    def answer_was_good(self, step: Step, text: str) -> bool:
        """Whether ``step``'s answer (already recorded) was good: for a checker, that its verdict agrees
        with the truth of the answer it checked; for everyone else, that it ended with ``[correct]``."""
        ok = text.rstrip().endswith(CORRECT)
        return ok == self.last_ok if step.agent in ("tester", "verifier") else ok

    def _next_role(self) -> str | None:
        if self.kind == "chat":
            return "chat" if self.steps == 0 else None
        last = self.last_role
        if self.kind == "codegen":
            order = {None: "planner", "planner": "coder", "coder": "tester"}
            if last == "tester":
                return "coder" if self.rounds < MAX_CODE_ROUNDS else None
            return order[last]
        if last == "verifier":
            return "solver" if self.rounds < MAX_MATH_ROUNDS else None
        return {None: "solver", "solver": "verifier"}[last]

    def _step_difficulty(self, role: str) -> float:
        d = self.difficulty
        if role == "planner":
            d *= 0.6
        elif role in ("coder", "solver"):
            d += (0.0 if self.plan_ok else 0.10) - 0.08 * self.rounds
        elif role in ("tester", "verifier"):
            d = 0.4 * d if self.last_ok else 0.98  # a wrong answer rarely passes a check
        return min(0.98, max(0.02, d))


def make_workflow(workload: str, seed: int, index: int) -> Workflow:
    """The ``index``-th workflow of ``workload`` under ``seed`` (independent of every other index)."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r} (one of {', '.join(WORKLOADS)})")
    rng = random.Random(f"{seed}:{workload}:{index}")
    kind = workload if workload != "mixed" else rng.choice(("codegen", "math"))
    topic, base = rng.choice(TOPICS[kind])
    difficulty = min(0.98, max(0.02, base + rng.gauss(0.0, 0.06)))
    detail = rng.choices([w for w, _, _ in DETAIL], weights=[p for _, _, p in DETAIL])[0]
    wf = Workflow(f"s{seed}-{workload}-{index}", kind, topic, difficulty, detail, rng)
    wf.transcript.append({"role": "user", "content": _task_text(wf)})
    return wf


def _task_text(wf: Workflow) -> str:
    rng = wf.rng
    lead = f"Answer {wf.detail}. " if wf.detail else ""
    if wf.kind == "codegen":
        n = int(40 + 200 * wf.difficulty + rng.uniform(0, 60))
        return f"{lead}Task: implement a {wf.topic} module in Python. Requirements: {_text(rng, n)}"
    if wf.kind == "math":
        n = int(40 + 200 * wf.difficulty + rng.uniform(0, 60))
        return f"{lead}Problem in {wf.topic}: {_text(rng, n)} Find the answer and justify it."
    wf.long = rng.random() < 0.2
    if wf.long:
        n = rng.randint(3000, 8000)
        return f"{lead}Here is a document about {wf.topic}: {_text(rng, n)}"
    n = rng.randint(100, 500)
    return f"{lead}A question about {wf.topic}: {_text(rng, n)}"
