"""The engine's waiting queue under vLLM's two scheduling policies (``--scheduling-policy``).

``fcfs`` (vLLM's default) is a deque: arrivals join the back, a preempted request goes back to the
front. ``priority`` follows ``vllm/v1/core/sched/request_queue.py``'s ``PriorityRequestQueue``:
requests leave in ``(priority, arrival time)`` order (a lower number first; ties by arrival), and a
preempted request simply rejoins in that order. Both offer the few operations the scheduler uses.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

from router.core.errors import ProfileError

POLICIES = ("fcfs", "priority")


class Queued(Protocol):
    priority: int
    arrival: float


T = TypeVar("T", bound=Queued)


class PriorityQueue(Generic[T]):
    """Requests by ``(priority, arrival)``; ``remove`` marks an entry dead instead of re-heaping."""

    __slots__ = ("_heap", "_live", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, T]] = []
        self._live: dict[int, int] = {}  # id(request) -> its live entry's sequence number
        self._seq = itertools.count()

    def append(self, req: T) -> None:
        seq = next(self._seq)
        self._live[id(req)] = seq
        heapq.heappush(self._heap, (req.priority, req.arrival, seq, req))

    appendleft = append  # vLLM's priority queue re-adds a preempted request in its order

    def _prune(self) -> None:
        heap, live = self._heap, self._live
        while heap and live.get(id(heap[0][3])) != heap[0][2]:
            heapq.heappop(heap)

    def popleft(self) -> T:
        self._prune()
        req = heapq.heappop(self._heap)[3]
        del self._live[id(req)]
        return req

    def remove(self, req: T) -> None:
        if self._live.pop(id(req), None) is None:
            raise ValueError("request not in the queue")

    def __getitem__(self, i: int) -> T:
        if i != 0:
            raise IndexError("only the head of a priority queue can be read")
        self._prune()
        if not self._heap:
            raise IndexError("empty queue")
        return self._heap[0][3]

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def __iter__(self) -> Iterator[T]:
        live = self._live
        return iter([e[3] for e in sorted(self._heap) if live.get(id(e[3])) == e[2]])


def make_queue(policy: str) -> deque[T] | PriorityQueue[T]:
    if policy == "fcfs":
        return deque()
    if policy == "priority":
        return PriorityQueue()
    raise ProfileError(
        f"scheduling policy must be one of {', '.join(POLICIES)}, got {policy!r}", setting="scheduling_policy"
    )
