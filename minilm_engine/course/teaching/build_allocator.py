"""Chapter 03's allocator pieces: the prefix-cache lookup, allocation with LRU eviction, freeing.

Contract: with `share_block` (build_pieces.py) they are the block pool's whole bookkeeping, as
plain data: blocks (`KVCacheBlock`: block_id, ref_cnt, block_hash), the free queue (an
OrderedDict block_id -> block, head evicted first) and the prefix cache (a dict hash -> block).

    cached_prefix(block_hashes, cached_blocks) -> blocks   a prompt's longest cached prefix
    take_free_blocks(num_blocks, free_queue, cached_blocks) -> blocks   allocate, evicting (LRU)
    release_blocks(blocks, free_queue) -> None               free: ref counts, the queue's tail

Each is checked alone first (small pools whose every branch is named: a miss in the middle of a
prompt, a cached block at the queue's head, a block still shared when freed), then in the engine
on two waves of prompts that share prefixes, with the pool's invariants after every step.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from minilm_engine import pluggable
from minilm_engine.core.block_pool import KVCacheBlock
from minilm_engine.course.teaching.build import BuildFailure, PieceError
from minilm_engine.course.teaching.build_pieces import PAGED_ARGS, _calls, _piece, _with, get_adapter
from minilm_engine.course.teaching.build_runs import (
    BuildSetup,
    first_schedule_difference,
    reference_run,
    require_same_tokens,
    run_engine,
)

Fn = Callable[..., Any]
# A pool small enough that the second wave evicts what the first left cached.
TIGHT_PAGED_ARGS = {**PAGED_ARGS, "num_kv_blocks": 24}


def _engine_check(registry_name: str, fn: Fn, setup: BuildSetup, alone: str) -> list[str]:
    details = [alone]
    for args in (PAGED_ARGS, TIGHT_PAGED_ARGS):
        want = reference_run(setup, args, waves=2)
        got = _with(registry_name, fn, lambda args=args: run_engine(setup, args, waves=2))
        diff = first_schedule_difference(got, want)
        if diff is not None:
            raise BuildFailure(f"with a pool of {args['num_kv_blocks']} blocks, two waves of prompts that share "
                               f"prefixes: the schedule differs from the reference's (prefix hits change how many "
                               f"tokens a prompt computes): {diff}")
        details.append(f"a pool of {args['num_kv_blocks']} blocks, two waves: the pool consistent after every step, "
                       f"the same schedule as the reference; " + require_same_tokens(got, want, setup))
    return [*details, _calls(registry_name)]


def _ids(blocks: Any) -> list[Any]:
    return [getattr(b, "block_id", b) for b in blocks]


# -- the prefix-cache lookup -----------------------------------------------------------------------


def _adapt_cached_prefix(fn: Fn) -> Fn:
    def call(block_hashes, cached_blocks):
        out = fn(list(block_hashes), cached_blocks)
        if not isinstance(out, (list, tuple)) or not all(isinstance(b, KVCacheBlock) for b in out):
            raise PieceError(f"return a list of the cached blocks (KVCacheBlock), got {out!r:.80}")
        return list(out)

    return call


def _check_cached_prefix_alone(call: Fn) -> str:
    blocks = {h: KVCacheBlock(block_id=i, ref_cnt=0, block_hash=h) for i, h in enumerate((101, 102, 104, 201))}
    cases = [
        ([101, 102, 104], "every block of the prompt is cached"),
        ([101, 102, 103, 104], "block 2's hash (103) is not cached, block 3's (104) is"),
        ([999, 102], "the first block misses"),
        ([], "a prompt shorter than one block"),
        ([201, 101], "a cached hash of another prompt's block 0 at position 1"),
    ]
    reference = pluggable.default("kv_cache.cached_prefix")
    for hashes, what in cases:
        got, want = call(hashes, dict(blocks)), reference(hashes, dict(blocks))
        if [b is w for b, w in zip(got, want)] != [True] * len(want) or len(got) != len(want):
            why = ("stop at the first miss: the blocks after a gap cannot be used without the KV of the one missing "
                   "before them" if len(got) > len(want) else "take every leading block whose hash is cached")
            raise BuildFailure(f"alone, block hashes {hashes} ({what}; cached: {sorted(blocks)}): your function "
                               f"returned blocks {_ids(got)}, the lookup gives {_ids(want)}: {why}")
    return f"alone: {len(cases)} lookups (all hit, a miss in the middle, a first miss, no full block) match"


def _check_cached_prefix(fn: Fn, setup: BuildSetup) -> list[str]:
    alone = _check_cached_prefix_alone(get_adapter("kv_cache.cached_prefix")(fn))
    return _engine_check("kv_cache.cached_prefix", fn, setup, alone)


_piece(
    name="cached_prefix",
    registry_name="kv_cache.cached_prefix",
    chapter="03",
    signature=(
        "def cached_prefix(block_hashes, cached_blocks) -> list[KVCacheBlock]\n"
        "  block_hashes: the chained hashes of a prompt's full blocks, in order; cached_blocks: the\n"
        "  prefix cache, hash -> block (read only). Return the cached blocks the prompt can reuse"
    ),
    hint=(
        "a block's hash names its whole prefix, so a lookup is one dict get per block; think about what a "
        "block after a gap would need that the cache does not have."
    ),
    adapt=_adapt_cached_prefix,
    run_check=_check_cached_prefix,
    solutions="03_paged_memory_solutions.ipynb",
)


# -- allocation with LRU eviction ------------------------------------------------------------------


EVICTED = {5: 55, 8: 88}  # the free blocks of `_pool` that hold a cached prefix: block id -> hash


def _pool() -> tuple[OrderedDict[int, KVCacheBlock], dict[int, KVCacheBlock], list[KVCacheBlock]]:
    """Free queue head first: 5 (cached, hash 55), 3 (free), 8 (cached, hash 88), 1 (free)."""
    blocks = [KVCacheBlock(5, 0, 55), KVCacheBlock(3, 0, None), KVCacheBlock(8, 0, 88), KVCacheBlock(1, 0, None)]
    held = KVCacheBlock(6, 2, 66)  # used by two requests, its prefix cached
    cached = {55: blocks[0], 88: blocks[2], 66: held}
    return OrderedDict((b.block_id, b) for b in blocks), cached, blocks


def _adapt_take_free_blocks(fn: Fn) -> Fn:
    def call(num_blocks, free_queue, cached_blocks):
        out = fn(num_blocks, free_queue, cached_blocks)
        if not isinstance(out, (list, tuple)) or not all(isinstance(b, KVCacheBlock) for b in out):
            raise PieceError(f"return the taken blocks as a list of KVCacheBlock, got {out!r:.80}")
        if len(out) != num_blocks:
            raise PieceError(f"{num_blocks} blocks were asked for, your function returned {len(out)}")
        return list(out)

    return call


def _check_take_free_blocks_alone(call: Fn) -> str:
    for num in (0, 1, 2, 4):
        queue, cached, blocks = _pool()
        before = list(queue)
        got = call(num, queue, cached)
        want_ids = before[:num]
        where = f"alone, free queue {before} (head first; 5 and 8 hold cached prefixes), {num} block(s) asked for"
        if _ids(got) != want_ids:
            raise BuildFailure(f"{where}: your function took blocks {_ids(got)}, expected {want_ids}: take from the "
                               f"head, the blocks freed longest ago (LRU), so a recently used prefix stays cached")
        for block in got:
            if block.ref_cnt != 1:
                raise BuildFailure(f"{where}: block {block.block_id} has ref_cnt {block.ref_cnt} after allocation, "
                                   f"expected 1: one request now holds it")
            if block.block_id in queue:
                raise BuildFailure(f"{where}: block {block.block_id} is still in the free queue after you took it: "
                                   f"the next allocation could hand it out again")
            evicted = EVICTED.get(block.block_id)
            if evicted is not None and (block.block_hash is not None or evicted in cached):
                raise BuildFailure(
                    f"{where}: block {block.block_id} held the cached prefix {evicted}; after your function "
                    f"{'cached_blocks still maps ' + str(evicted) + ' to it' if evicted in cached else 'its block_hash is still set'}"
                    f": its KV is about to be overwritten, so the hash must lead nobody to it (evict it)")
        want_cached = {55, 88, 66} - {EVICTED[i] for i in want_ids if i in EVICTED}
        if list(queue) != before[num:] or set(cached) != want_cached:
            raise BuildFailure(f"{where}: after your function the free queue is {list(queue)} and the cached hashes "
                               f"{sorted(cached)}; expected {before[num:]} and {sorted(want_cached)}: change only "
                               f"the blocks you take")
    return "alone: 0, 1, 2 and all 4 free blocks taken from a queue with cached blocks: LRU order, evictions, ref counts"


def _check_take_free_blocks(fn: Fn, setup: BuildSetup) -> list[str]:
    alone = _check_take_free_blocks_alone(get_adapter("kv_cache.take_free_blocks")(fn))
    return _engine_check("kv_cache.take_free_blocks", fn, setup, alone)


_piece(
    name="take_free_blocks",
    registry_name="kv_cache.take_free_blocks",
    chapter="03",
    signature=(
        "def take_free_blocks(num_blocks, free_queue, cached_blocks) -> list[KVCacheBlock]\n"
        "  allocate num_blocks blocks (the queue has enough). free_queue: OrderedDict block_id -> block\n"
        "  of the blocks nobody holds, head = freed longest ago; cached_blocks: the prefix cache, hash -> block.\n"
        "  Change the queue, the cache and the blocks in place; return the blocks taken"
    ),
    hint=(
        "which free block is least likely to be asked for again? And a free block may still hold a cached "
        "prefix: once you hand it out, its KV will be overwritten, and nobody may find it by its hash."
    ),
    adapt=_adapt_take_free_blocks,
    run_check=_check_take_free_blocks,
    solutions="03_paged_memory_solutions.ipynb",
)


# -- freeing -----------------------------------------------------------------------------------------


def _adapt_release_blocks(fn: Fn) -> Fn:
    def call(blocks, free_queue):
        out = fn(list(blocks), free_queue)
        if out is not None:
            raise PieceError(f"release_blocks changes the blocks and the queue in place and returns None, got {out!r:.60}")

    return call


def _check_release_blocks_alone(call: Fn) -> str:
    queue = OrderedDict((b.block_id, b) for b in [KVCacheBlock(4, 0, None)])
    # A table passed reversed by the caller: block 9 (its tail, held once), 2 (shared by two
    # requests), 7 (its head, held once, its prefix cached).
    table = [KVCacheBlock(9, 1, None), KVCacheBlock(2, 2, 22), KVCacheBlock(7, 1, 77)]
    call(table, queue)
    where = "alone, blocks [9, 2, 7] freed in that order (ref_cnt 1, 2, 1; 2 and 7 cached), free queue [4]"
    counts = {b.block_id: b.ref_cnt for b in table}
    if counts != {9: 0, 2: 1, 7: 0}:
        raise BuildFailure(f"{where}: the ref counts are {counts} after, expected {{9: 0, 2: 1, 7: 0}}: each block "
                           f"loses one holder")
    if 2 in queue:
        raise BuildFailure(f"{where}: block 2 joined the free queue, but another request still holds it (ref_cnt 1): "
                           f"the next allocation would overwrite its KV under it")
    if list(queue) != [4, 9, 7]:
        raise BuildFailure(f"{where}: the free queue is {list(queue)} after, expected [4, 9, 7]: blocks nobody holds "
                           f"join the tail (evicted last), in the order given (the caller puts a table's tail first, "
                           f"so its least shared blocks are evicted first)")
    if table[2].block_hash != 77 or table[1].block_hash != 22:
        raise BuildFailure(f"{where}: a freed block lost its cached prefix: keep block_hash, so a later prompt with "
                           f"the same prefix can take the block back until it is evicted")
    return "alone: a reversed table with a shared and a cached block freed: ref counts, the queue's tail, order, hashes"


def _check_release_blocks(fn: Fn, setup: BuildSetup) -> list[str]:
    alone = _check_release_blocks_alone(get_adapter("kv_cache.release_blocks")(fn))
    return _engine_check("kv_cache.release_blocks", fn, setup, alone)


_piece(
    name="release_blocks",
    registry_name="kv_cache.release_blocks",
    chapter="03",
    signature=(
        "def release_blocks(blocks, free_queue) -> None\n"
        "  a request gives its blocks back (the caller passes its table reversed, and never frees a block\n"
        "  more often than it is held). free_queue: OrderedDict block_id -> block, head evicted first"
    ),
    hint=(
        "a block may be shared: it is free only when its last holder lets go. A freed block's KV is still "
        "valid: where in the queue should it wait, and what should it keep?"
    ),
    adapt=_adapt_release_blocks,
    run_check=_check_release_blocks,
    solutions="03_paged_memory_solutions.ipynb",
)
