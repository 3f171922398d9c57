"""An approximate prefix index kept in the gateway: prompt-block hash -> workers that recently served it.

Bounded LRU over block hashes (:func:`predictor.sketch.prefix_hashes`), each remembering at most
``ways`` workers (the most recent). Hashes are chained, so a hit on block ``i`` means the whole
prefix up to ``i`` was sent to that worker; :meth:`PrefixIndex.match` returns, per worker, how many
leading blocks it has seen. Whether the worker still holds them is a guess (it may have evicted
them), which the latency model learns to discount. The index is local to this gateway process;
sharing it through the fleet state (Redis) is future work.
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

    def record(self, hashes: Sequence[int], worker: str) -> list[int]:
        """``worker`` was sent a prompt with these leading blocks. Returns the hashes whose most recent
        worker this changed (new to the index, or last seen on another worker): the news worth
        telling other gateways."""
        entries = self._entries
        news: list[int] = []
        for h in hashes:
            workers = entries.get(h)
            if workers is None:
                entries[h] = [worker]
                news.append(h)
            else:
                if workers[-1] != worker:
                    news.append(h)
                    if worker in workers:
                        workers.remove(worker)
                    workers.append(worker)
                    del workers[: -self.ways]
                entries.move_to_end(h)
        while len(entries) > self.capacity:
            entries.popitem(last=False)
        return news
