"""The paged KV cache and its prefix cache, without an engine."""

from __future__ import annotations

from backends.sim.kvcache import KVCache


class Seq:
    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []
        self.num_cached_blocks = 0

    def token_slice(self, start: int, stop: int) -> tuple[int, ...]:
        return tuple(self.tokens[start:stop])


def admit(kv: KVCache, seq: Seq) -> int:
    """Allocate the whole sequence with its cached prefix; return the tokens hit."""
    prefix = kv.find_prefix(seq, len(seq.tokens))
    assert kv.allocate(seq, len(seq.tokens), prefix)
    kv.commit_full_blocks(seq, len(seq.tokens))
    return len(prefix) * kv.block_size


def test_allocation_counts_blocks_and_fails_without_side_effects() -> None:
    kv = KVCache(num_blocks=4, block_size=16)
    a = Seq(list(range(40)))  # 3 blocks
    assert kv.allocate(a, 40)
    assert len(a.block_ids) == 3 and kv.num_free_blocks == 1
    assert kv.usage == 0.75
    b = Seq(list(range(100, 140)))
    assert not kv.allocate(b, 40)
    assert b.block_ids == [] and kv.num_free_blocks == 1
    assert kv.allocate(a, 49)  # growing into a 4th block
    assert kv.num_free_blocks == 0 and kv.usage == 1.0


def test_prefix_hit_reuses_full_blocks_and_leaves_the_last_token() -> None:
    kv = KVCache(num_blocks=32, block_size=16)
    first = Seq(list(range(64)))
    assert admit(kv, first) == 0
    kv.free(first)
    assert kv.usage == 0.0 and kv.num_cached_blocks == 4  # freed but still cached
    # The same 64 tokens: at most 63 may be hit, so only 3 full blocks are reused.
    assert admit(kv, Seq(list(range(64)))) == 48
    # A longer prompt sharing the prefix hits all 4 blocks.
    assert admit(kv, Seq([*range(64), 1, 2, 3])) == 64


def test_hashes_are_chained_so_equal_blocks_after_different_prefixes_do_not_match() -> None:
    kv = KVCache(num_blocks=32, block_size=16)
    common = list(range(16))
    admit(kv, Seq([*range(100, 116), *common, 7]))
    assert admit(kv, Seq([*range(200, 216), *common, 7])) == 0


def test_shared_blocks_are_reference_counted() -> None:
    kv = KVCache(num_blocks=8, block_size=16)
    a, b = Seq(list(range(33))), Seq(list(range(33)))
    admit(kv, a)
    assert admit(kv, b) == 32
    assert a.block_ids[:2] == b.block_ids[:2]
    assert kv.num_free_blocks == 8 - 4  # 2 shared + 1 tail each
    kv.free(a)
    assert kv.num_free_blocks == 5  # only a's own tail returned
    kv.free(b)
    assert kv.num_free_blocks == 8


def test_free_cached_blocks_are_evicted_lru_only_when_needed() -> None:
    kv = KVCache(num_blocks=6, block_size=16)
    old, new = Seq(list(range(32))), Seq(list(range(500, 532)))
    admit(kv, old)
    kv.free(old)
    admit(kv, new)
    kv.free(new)
    assert kv.num_cached_blocks == 4
    # Four fresh blocks: the two never-used ones, then the least recently freed (old's) are evicted.
    filler = Seq(list(range(900, 964)))
    assert kv.allocate(filler, 64)
    kv.free(filler)
    assert admit(kv, Seq([*range(500, 532), 1])) == 32
    assert admit(kv, Seq([*range(32), 1])) == 0


def test_block_hashes_are_stable_across_processes() -> None:
    kv = KVCache(num_blocks=4, block_size=4)
    seq = Seq([1, 2, 3, 4, 5, 6, 7, 8])
    # hash() of tuples of ints does not depend on PYTHONHASHSEED, so a router may compute these too.
    assert kv.block_hashes(seq, 8) == [hash((0, (1, 2, 3, 4))), hash((hash((0, (1, 2, 3, 4))), (5, 6, 7, 8)))]
