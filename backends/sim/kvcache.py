"""Paged KV cache with automatic prefix caching, after vLLM V1's ``KVCacheManager``/``BlockPool``.

Blocks hold ``block_size`` tokens. A block that fills up is hashed by content, chained to its
parent (``hash((parent_hash, tokens))``) so that one hash names a whole prefix, and registered in
the prefix cache. A freed block keeps its hash (reference count 0) and sits in an LRU queue of free
blocks; it is only evicted, losing its hash, when a new allocation needs it. Python hashes tuples
of ints the same way in every process, so block hashes are stable across runs.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

_NO_HASH = -1  # hash() of a tuple is never -1 in CPython (it is reserved for errors)


class Sequence(Protocol):
    """What the cache needs to know about a request."""

    block_ids: list[int]
    block_hashes: list[int]
    num_cached_blocks: int  # how many of block_ids are registered in the prefix cache

    def token_slice(self, start: int, stop: int) -> tuple[int, ...]: ...


class KVCache:
    """Fixed pool of ``num_blocks`` blocks; all bookkeeping is O(blocks touched)."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._hash = [_NO_HASH] * num_blocks
        # Free blocks (ref count 0) in eviction order: the first is evicted first.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id

    # -- queries -----------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Share of blocks referenced by a request (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - len(self._free) / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def block_hashes(self, seq: Sequence, num_tokens: int) -> list[int]:
        """The chained hashes of the full blocks among the first ``num_tokens`` tokens of ``seq``."""
        hashes = seq.block_hashes
        bs = self.block_size
        for i in range(len(hashes), num_tokens // bs):
            parent = hashes[i - 1] if i else 0
            hashes.append(hash((parent, seq.token_slice(i * bs, (i + 1) * bs))))
        return hashes

    def find_prefix(self, seq: Sequence, num_tokens: int) -> list[int]:
        """Cached blocks of the longest cached prefix, leaving at least the last token to compute."""
        hit: list[int] = []
        cached = self._cached
        for h in self.block_hashes(seq, num_tokens - 1):
            block = cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    # -- allocation --------------------------------------------------------------------------------
    def allocate(self, seq: Sequence, num_total_tokens: int, prefix: list[int] | None = None) -> bool:
        """Make room for ``num_total_tokens`` tokens of ``seq``, reusing ``prefix`` blocks first.

        Returns False, changing nothing, when the free blocks do not suffice.
        """
        held = len(seq.block_ids) + (len(prefix) if prefix else 0)
        need = -(-num_total_tokens // self.block_size) - held
        if prefix:
            ref = self._ref
            reclaimed = sum(1 for b in prefix if ref[b] == 0)
            if need > len(self._free) - reclaimed:
                return False
            free = self._free
            for b in prefix:
                if ref[b] == 0:
                    del free[b]
                ref[b] += 1
            seq.block_ids.extend(prefix)
            seq.num_cached_blocks = len(seq.block_ids)
        elif need > len(self._free):
            return False
        if need > 0:
            self._take(seq.block_ids, need)
        return True

    def commit_full_blocks(self, seq: Sequence, num_computed_tokens: int) -> None:
        """Register the blocks of ``seq`` that are full once ``num_computed_tokens`` are in the cache."""
        full = num_computed_tokens // self.block_size
        if full <= seq.num_cached_blocks:
            return
        hashes = self.block_hashes(seq, full * self.block_size)
        ids, cached, bhash = seq.block_ids, self._cached, self._hash
        for i in range(seq.num_cached_blocks, full):
            block, h = ids[i], hashes[i]
            bhash[block] = h
            cached.setdefault(h, block)  # a duplicate keeps the first copy findable
        seq.num_cached_blocks = full

    def free(self, seq: Sequence) -> None:
        """Release the blocks of ``seq``; they stay cached until evicted, tail blocks first."""
        ref, free = self._ref, self._free
        for b in reversed(seq.block_ids):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None
        seq.block_ids = []
        seq.num_cached_blocks = 0

    def reset_prefix_cache(self) -> None:
        for b in self._free:
            self._hash[b] = _NO_HASH
        self._cached = {b_hash: b for b_hash, b in self._cached.items() if self._ref[b] > 0}

    def _take(self, out: list[int], n: int) -> None:
        free, ref, bhash, cached = self._free, self._ref, self._hash, self._cached
        for _ in range(n):
            block, _unused = free.popitem(last=False)
            h = bhash[block]
            if h != _NO_HASH:
                if cached.get(h) == block:
                    del cached[h]
                bhash[block] = _NO_HASH
            ref[block] = 1
            out.append(block)
