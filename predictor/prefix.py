"""An approximate prefix index kept in the gateway: prompt-block hash -> workers that recently served it.

Bounded LRU over block hashes (:func:`predictor.sketch.prefix_hashes`), each remembering at most
``ways`` workers (the most recent). Hashes are chained, so a hit on block ``i`` means the whole
prefix up to ``i`` was sent to that worker; :meth:`PrefixIndex.match` returns, per worker, how many
leading blocks it has seen. Whether the worker still holds them is a guess (it may have evicted
them), which the latency model learns to discount. Each gateway process keeps its own index;
gateways sharing a Redis fleet state send each other the chains :meth:`PrefixIndex.record` reports
news in (``router.state.base.FleetState.share_prefix``), so a workflow's next stage finds its
worker whichever replica it reaches.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from predictor.sketch import WORDS_PER_BLOCK


class PrefixIndex:
    def __init__(self, capacity: int = 200_000, ways: int = 4) -> None:
        self.capacity = capacity
        self.ways = ways
        self._entries: OrderedDict[int, list[str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Worker -> number of leading blocks of ``hashes`` it was last sent."""
        out: dict[str, int] = {}
        entries = self._entries
        for i, h in enumerate(hashes):
            workers = entries.get(h)
            if workers is None:
                break
            for w in workers:
                out[w] = i + 1
        return out

    def shares(self, hashes: Sequence[int], prompt_tokens: int) -> dict[str, float]:
        """Worker -> expected cached share of a prompt of ``prompt_tokens`` (0..1)."""
        if not hashes or prompt_tokens <= 0:
            return {}
        return {w: min(1.0, n * WORDS_PER_BLOCK / prompt_tokens) for w, n in self.match(hashes).items()}

    def record(self, hashes: Sequence[int], worker: str) -> int:
        """``worker`` was sent a prompt with these leading blocks. Returns how many of them, from the
        first, another gateway should be told about: up to the deepest block whose most recent worker
        this changed (new to the index, or last seen on another worker), 0 when nothing changed. The
        whole chain up to it, not the changed blocks alone: a receiver's lookups walk from the first
        block, so its copy of a shared head (a system prompt) must stay fresh in its LRU too."""
        entries = self._entries
        depth = 0
        for i, h in enumerate(hashes):
            workers = entries.get(h)
            if workers is None:
                entries[h] = [worker]
                depth = i + 1
            else:
                if workers[-1] != worker:
                    depth = i + 1
                    if worker in workers:
                        workers.remove(worker)
                    workers.append(worker)
                    del workers[: -self.ways]
                entries.move_to_end(h)
        while len(entries) > self.capacity:
            entries.popitem(last=False)
        return depth
