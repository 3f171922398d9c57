"""One sequence in the simulated engine and its status; also how its tokens reach the HTTP handler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from enum import Enum

from backends.sim.textgen import MARKER_INDEX, VOCAB_IDS, Answer


class Status(Enum):
    PENDING = "pending"  # in the API front end (serial front end, ttft overhead), not yet in the engine
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


class Request:
    """One sequence in the engine; also the channel its tokens reach the HTTP handler through."""

    __slots__ = (
        "arrival",
        "block_hashes",
        "block_ids",
        "cached_tokens",
        "final_len",
        "finish_reason",
        "finished_at",
        "first_scheduled",
        "first_token",
        "last_token",
        "marker_at",
        "marker_index",
        "min_tokens",
        "notify_each",
        "num_cached_blocks",
        "num_computed",
        "output",
        "priority",
        "prompt_ids",
        "prompt_len",
        "queued_at",
        "random",
        "request_id",
        "status",
        "waiter",
        "word_start",
    )

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        answer: Answer,
        max_tokens: int,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        arrival: float = 0.0,
        random: bool = False,
        priority: int = 0,
    ) -> None:
        self.request_id = request_id
        self.priority = priority  # the queue's order under the priority policy (lower first)
        self.random = random  # samples at random (temperature > 0), not by a greedy argmax
        self.min_tokens = min_tokens
        self.prompt_ids = prompt_ids
        self.prompt_len = len(prompt_ids)
        self.output: list[int] = []  # vocabulary indices of the generated words
        self.num_computed = 0  # tokens whose KV is in the cache
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []
        self.num_cached_blocks = 0
        self.cached_tokens = 0  # prompt tokens found in the prefix cache when first scheduled (num_cached_tokens)
        self.status = Status.PENDING
        self.arrival = arrival
        self.queued_at = arrival  # when it reached the engine's queue (after the front end)
        self.first_scheduled = -1.0
        self.first_token = -1.0
        self.last_token = -1.0
        self.finished_at = -1.0
        self.waiter: asyncio.Future[None] | None = None
        self.notify_each = True  # wake the waiter on every token, not only at the end
        self.word_start = answer.word_start
        # How the answer ends is fixed up front: EOS after the natural length (at least
        # min_tokens), unless max_tokens cuts it first or ignore_eos runs on to max_tokens.
        natural = max(answer.natural_tokens, min_tokens)
        if ignore_eos or natural > max_tokens:
            self.final_len, self.finish_reason = max_tokens, "length"
        else:
            self.final_len, self.finish_reason = natural, "stop"
        complete = ignore_eos or natural <= max_tokens
        self.marker_at = self.final_len - 1 if complete and answer.marker else -1
        self.marker_index = MARKER_INDEX[answer.marker] if answer.marker else -1

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + len(self.output)

    @property
    def done(self) -> bool:
        return self.status is Status.FINISHED or self.status is Status.ABORTED

    def token_slice(self, start: int, stop: int) -> tuple[int, ...]:
        p = self.prompt_len
        if stop <= p:
            return tuple(self.prompt_ids[start:stop])
        gen = tuple(VOCAB_IDS[k] for k in self.output[max(start - p, 0) : stop - p])
        return tuple(self.prompt_ids[start:p]) + gen if start < p else gen

    async def wait_for_output(self, seen: int) -> None:
        """Return once more than ``seen`` tokens exist or the request is done."""
        if len(self.output) > seen or self.done:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiter = fut
        await fut

    async def follow(self) -> AsyncIterator[tuple[int, int]]:
        """``(start, stop)`` of each run of new tokens, until the last; ends early (status ABORTED) on abort."""
        sent = 0
        while True:
            await self.wait_for_output(sent)
            if self.status is Status.ABORTED:
                return
            n = len(self.output)
            if n > sent:
                yield sent, n
                sent = n
            if n >= self.final_len:
                return

    def wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)
