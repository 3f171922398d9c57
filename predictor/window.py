"""The bounded window of recent completions an online refit trains on, bucketed by load.

A plain FIFO forgets rare regimes (a burst an hour ago) as soon as steady traffic refills it, and
the model then mispredicts exactly when it matters. As llm-d's predictor does, completions are kept
per load bucket (the chosen worker's in-flight requests at dispatch); when the window is full the
oldest completion of the *largest* bucket goes, so every regime keeps its share.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping
from typing import Any

LOAD_EDGES = (1, 3, 8, 16, 32, 64)  # bucket i holds in-flight counts in [EDGES[i-1], EDGES[i])


class TrainingWindow:
    def __init__(self, capacity: int = 5000) -> None:
        self.capacity = capacity
        self._buckets: list[deque[dict[str, Any]]] = [deque() for _ in range(len(LOAD_EDGES) + 1)]
        self._size = 0
        self.added = 0  # completions ever added (a refit compares it with the count at its last fit)

    def __len__(self) -> int:
        return self._size

    def add(self, record: dict[str, Any]) -> None:
        fleet = record.get("fleet")
        load = int(fleet.get("inflight_requests") or 0) if isinstance(fleet, Mapping) else 0
        self._buckets[bisect.bisect_right(LOAD_EDGES, load)].append(record)
        self._size += 1
        self.added += 1
        if self._size > self.capacity:
            max(self._buckets, key=len).popleft()
            self._size -= 1

    def records(self) -> list[dict[str, Any]]:
        """A copy, oldest first within each bucket (order across buckets does not matter to a fit)."""
        return [r for b in self._buckets for r in b]

    def sizes(self) -> list[int]:
        return [len(b) for b in self._buckets]
