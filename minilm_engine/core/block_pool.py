"""The pool of fixed-size KV-cache blocks: ref counts, an LRU free queue and a prefix-hash map.

Contract: `BlockPool` only does bookkeeping; it never touches a tensor.  Block `i` stands for
cache slots `[i * block_size, (i + 1) * block_size)` of the runner's key/value caches; which
request holds which blocks is `kv_cache_manager.BlockManager`'s job (vLLM v1's `block_pool.py`).

Every block is in exactly one of three states:

    state          ref_cnt   block_hash   in the free queue   meaning
    "used"           >= 1    any          no                  read or written by running requests
    "cached_free"       0    an int       yes                 nobody uses it, but its KV is still
                                                              valid: a later prompt with the same
                                                              prefix can take it back (`touch`)
    "free"              0    None         yes                 holds nothing worth keeping

A block's life:

                  get_new_blocks                     free_blocks (ref_cnt -> 0)
       "free" ─────────────────────> "used" ────────────────────────────────> "free"
                                       │
                                       │ cache_full_block (all block_size slots written)
                                       v                free_blocks (ref_cnt -> 0)
                           "used", block_hash set ────────────────────────> "cached_free"
                                       ^                                         │   │
                                       └──────── touch (a prefix-cache hit) ─────┘   │
                                                                                     │
       "used" for a new owner, hash dropped (eviction) <──── get_new_blocks ─────────┘
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from dataclasses import dataclass
from typing import Literal

from minilm_engine.pluggable import replaceable

BlockEventKind = Literal["allocated", "shared", "freed", "evicted", "cached"]
BlockState = Literal["used", "cached_free", "free"]


@dataclass
class KVCacheBlock:
    """One block of the paged KV cache.  `block_hash`: None unless the block is full and in the
    prefix cache; then the chained hash of every token up to its end (`hash_block_tokens`)."""

    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None


@dataclass(frozen=True)
class BlockEvent:
    """One change to one block, as an observer of the pool sees it (the engine's trace)."""

    kind: BlockEventKind
    block_id: int


# Called with every event, in order.  Without an observer the pool builds no event at all.
BlockObserver = Callable[[BlockEvent], None]


class BlockEventLog:
    """An observer that keeps a pool's events until `drain()` (the engine's trace uses one)."""

    def __init__(self) -> None:
        self._events: list[BlockEvent] = []

    def __call__(self, event: BlockEvent) -> None:
        self._events.append(event)

    def drain(self) -> list[BlockEvent]:
        """The events since the last call, oldest first; the log starts over."""
        events, self._events = self._events, []
        return events


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """Hash of one full block of tokens, with the hash of the block before it folded in.

        block 0: h0 = H(None, t[0:4])      block_size = 4
        block 1: h1 = H(h0,   t[4:8])
        block 2: h2 = H(h1,   t[8:12])

    Because of the chain, `h2` names the whole prefix t[0:12]: two prompts share block 2's KV
    only if they agree on all 12 tokens, and a prefix lookup is one dict lookup per block.
    sha256, not `hash()`: the same value in every process, and no collisions.
    """
    text = f"{parent_hash}|{','.join(str(int(t)) for t in token_ids)}"
    digest = hashlib.sha256(text.encode("ascii")).digest()
    return int.from_bytes(digest[:8], "little")


@replaceable("kv_cache.share_block")
def share_block(block: KVCacheBlock, free_queue: OrderedDict[int, KVCacheBlock]) -> None:
    """One more request holds `block` (a prefix-cache hit): ref_cnt += 1, and a block that was
    free (ref_cnt 0, its prefix still cached) leaves the free queue, so it cannot be evicted."""
    if block.ref_cnt == 0:
        del free_queue[block.block_id]
    block.ref_cnt += 1


@replaceable("kv_cache.take_free_blocks")
def take_free_blocks(
    num_blocks: int, free_queue: OrderedDict[int, KVCacheBlock], cached_blocks: dict[int, KVCacheBlock]
) -> list[KVCacheBlock]:
    """Allocation: the `num_blocks` blocks at the head of the free queue (freed longest ago: LRU),
    each now held once (ref_cnt 1).  A taken block that still held a cached prefix loses it
    (eviction): its KV is about to be overwritten, so its hash must lead nobody to it any more.
    The caller has checked that the queue holds enough blocks."""
    new_blocks = []
    for _ in range(num_blocks):
        _, block = free_queue.popitem(last=False)
        if block.block_hash is not None:
            del cached_blocks[block.block_hash]
            block.block_hash = None
        block.ref_cnt = 1
        new_blocks.append(block)
    return new_blocks


@replaceable("kv_cache.release_blocks")
def release_blocks(blocks: Sequence[KVCacheBlock], free_queue: OrderedDict[int, KVCacheBlock]) -> None:
    """Freeing: one holder fewer for each block; a block nobody holds any more joins the tail of
    the free queue, in the order given (evicted last), and keeps its cached prefix, so a later
    prompt can still take it back.  The caller has checked there is no double free."""
    for block in blocks:
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            free_queue[block.block_id] = block


class BlockPool:
    """Owns all `num_blocks` blocks of the KV cache.

    Invariants (`check_invariants`, after every step of tests/test_block_pool.py's machine):
      * `ref_cnt >= 0` for every block;
      * a block is in the free queue  <=>  its `ref_cnt == 0`;
      * `num_free_blocks + num_used_blocks == num_blocks`;
      * `cached_blocks[h].block_hash == h` for every key `h`, and every block with a hash is
        the value of its hash's entry (so one hash names at most one block).

    The free queue is ordered from least to most recently freed:

        head (evicted first)                                     tail (freed last)
          [ b7 ] <-> [ b2 ] <-> [ b5 ] <-> ... <-> [ b0 ]
        ^ get_new_blocks pops here     free_blocks appends here ^
                            touch removes a hit from anywhere, in O(1)

    so the cached block that has waited longest is the one evicted (LRU); an `OrderedDict` keyed
    by block id removes from the middle in O(1), as a doubly linked list would.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True,
                 observer: BlockObserver | None = None):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.observer = observer
        self.blocks = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
        # block_id -> block, head first. Initially in id order so the first allocation is 0, 1, ...
        self._free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (block.block_id, block) for block in self.blocks)
        self.cached_blocks: dict[int, KVCacheBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_cnt 0, whether or not they still hold a cached prefix."""
        return len(self._free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, used or free."""
        return len(self.cached_blocks)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a reusable prefix (evicted only when needed)."""
        return sum(1 for block in self.cached_blocks.values() if block.ref_cnt == 0)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, from 0.0 to 1.0; cached-free blocks count as free."""
        return self.num_used_blocks / self.num_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """`num_blocks` blocks from the head of the free queue, each held once (`take_free_blocks`:
        a block that held a cached prefix loses it)."""
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot allocate {num_blocks} blocks: only {self.num_free_blocks} of "
                             f"{self.num_blocks} are free (check with num_free_blocks first)")
        evicted = set()  # (which of the blocks about to be taken hold a prefix: for an observer)
        if self.observer is not None:
            heads = islice(self._free_queue.values(), num_blocks)
            evicted = {block.block_id for block in heads if block.block_hash is not None}
        new_blocks = take_free_blocks(num_blocks, self._free_queue, self.cached_blocks)
        if self.observer is not None:
            for block in new_blocks:
                if block.block_id in evicted:
                    self._log("evicted", block)
                self._log("allocated", block)
        return new_blocks

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        """The block holding the prefix named by `block_hash`, used or free; None on a miss."""
        return self.cached_blocks.get(block_hash)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Share `blocks` with one more request (a prefix-cache hit: `share_block`).  Touching a
        free block that holds no cached prefix is a bug (its KV is garbage)."""
        blocks = list(blocks)
        for block in blocks:
            if block.ref_cnt == 0 and block.block_hash is None:
                raise ValueError(f"cannot touch block {block.block_id}: it is free and holds no "
                                 f"cached prefix (evicted since get_cached_block returned it?)")
        for block in blocks:
            share_block(block, self._free_queue)
            self._log("shared", block)

    def cache_full_block(self, block: KVCacheBlock, block_hash: int) -> bool:
        """Register a full block under `block_hash`; return whether `block` is now the cached one.
        If another block holds this hash (two requests computed the same prefix at once), that
        one stays: one hash names one block, and `block` is freed later like any uncached one."""
        if not self.enable_caching:
            return False
        if block.ref_cnt == 0:
            raise ValueError(f"cannot cache block {block.block_id}: it is free (ref_cnt 0)")
        if block.block_hash is not None:
            if block.block_hash != block_hash:
                raise ValueError(f"block {block.block_id} is already cached under another hash "
                                 f"({block.block_hash} != {block_hash})")
            return True
        if block_hash in self.cached_blocks:
            return False
        block.block_hash = block_hash
        self.cached_blocks[block_hash] = block
        self._log("cached", block)
        return True

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (e.g. after new weights); return how many were dropped.
        Blocks in use keep their data for their owners; they can no longer be shared."""
        num_dropped = len(self.cached_blocks)
        for block in self.cached_blocks.values():
            block.block_hash = None
            self._log("evicted", block)
        self.cached_blocks.clear()
        return num_dropped

    def free_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference to each block (`release_blocks`), in the order given: the caller
        chooses which is evicted first.  A double free raises, and then nothing changes."""
        blocks = list(blocks)
        num_frees: dict[int, int] = {}
        for block in blocks:
            num = num_frees[block.block_id] = num_frees.get(block.block_id, 0) + 1
            if num > block.ref_cnt:
                raise ValueError(f"double free of block {block.block_id}: ref_cnt is "
                                 f"{block.ref_cnt} but it was freed {num} time(s)")
        release_blocks(blocks, self._free_queue)
        if self.observer is not None:
            for block_id in dict.fromkeys(block.block_id for block in blocks if block.ref_cnt == 0):
                self.observer(BlockEvent("freed", block_id))

    def block_state(self, block: KVCacheBlock) -> BlockState:
        if block.ref_cnt > 0:
            return "used"
        return "free" if block.block_hash is None else "cached_free"

    def free_queue_ids(self) -> list[int]:
        """Ids of the free blocks, next to be evicted first."""
        return list(self._free_queue)

    def snapshot(self) -> list[dict]:
        """One dict per block (block_id, ref_cnt, block_hash, state), for the memory widget."""
        return [
            {"block_id": block.block_id, "ref_cnt": block.ref_cnt, "block_hash": block.block_hash,
             "state": self.block_state(block)}
            for block in self.blocks
        ]

    def check_invariants(self) -> None:
        """Raise AssertionError if an invariant of the class docstring is broken (O(num_blocks))."""
        for block in self.blocks:
            assert block.ref_cnt >= 0, f"block {block.block_id} has ref_cnt {block.ref_cnt}"
            in_queue = block.block_id in self._free_queue
            assert in_queue == (block.ref_cnt == 0), (
                f"block {block.block_id}: ref_cnt {block.ref_cnt} but in free queue: {in_queue}")
            if block.block_hash is not None:
                assert self.cached_blocks.get(block.block_hash) is block, (
                    f"block {block.block_id} has a hash that does not lead back to it")
        for block_hash, block in self.cached_blocks.items():
            assert block.block_hash == block_hash, (
                f"hash {block_hash} maps to block {block.block_id}, which has {block.block_hash}")
        num_used = sum(1 for block in self.blocks if block.ref_cnt > 0)
        assert num_used + self.num_free_blocks == self.num_blocks, (
            f"{num_used} used + {self.num_free_blocks} free != {self.num_blocks} blocks")

    def _log(self, kind: BlockEventKind, block: KVCacheBlock) -> None:
        if self.observer is not None:
            self.observer(BlockEvent(kind, block.block_id))
