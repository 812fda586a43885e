"""Per-request block tables on top of a `BlockPool`, with prefix caching.

Contract: the manager maps `request_id -> block table` (the request's blocks in token order; a
token's slot follows from it: `kv_cache_utils.slot_mapping`) and knows nothing else about
requests: callers pass token ids and counts.  It hands out cache slots; the model runner writes
keys/values into them; the scheduler decides who runs (vLLM v1's `kv_cache_manager.py`,
nano-vllm's `block_manager.py`).

Prefix caching: once a block is full and its KV written, it is registered under the hash of
ALL tokens up to its end (each hash chains its parent's). A new prompt walks its own chain and
stops at the first miss:

    prompt   [ sys sys sys sys | sys sys q1 q2 | q3 q4 q5 ]
    hashes     h0=H(None, ...)   h1=H(h0, ...)   (not full: never cached)
    lookup     h0 -> block 7  ✓  h1 -> miss  ✗   => computed_blocks = [7], 4 cached tokens

One step of the engine, for one request (the check/act pairs are nano-vllm's):

    1. new request only:  blocks, num_cached = manager.get_computed_blocks(token_ids)
                          num_computed_tokens = num_cached
    2. if manager.can_allocate_slots(rid, num_computed_tokens, num_new_tokens, blocks):
           manager.allocate_slots(rid, num_computed_tokens, num_new_tokens, blocks)
    3. the model writes KV for positions [num_computed_tokens, num_computed_tokens + num_new_tokens)
       into manager.slot_mapping(rid, num_computed_tokens, num_computed_tokens + num_new_tokens)
    4. num_computed_tokens += num_new_tokens
       manager.commit(rid, token_ids, num_computed_tokens)   # cache the blocks that became full
    5. when the request finishes or is preempted: manager.free(rid)

The caller (the Request) owns `num_computed_tokens`; the manager only checks it is consistent.
Blocks are cached in step 4, after the forward pass, never before their KV exists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from minilm_engine.core.block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from minilm_engine.core.kv_cache_utils import cdiv, slot_mapping
from minilm_engine.pluggable import replaceable

__all__ = ["BlockManager", "cdiv"]


@replaceable("kv_cache.cached_prefix")
def cached_prefix(block_hashes: Sequence[int], cached_blocks: Mapping[int, KVCacheBlock]) -> list[KVCacheBlock]:
    """The prefix-cache lookup: the cached blocks of the longest run of leading `block_hashes`
    (a prompt's chained full-block hashes) found in `cached_blocks` (read-only).  It stops at the
    first miss: a block after the gap is useless without the KV of the one missing before it."""
    blocks: list[KVCacheBlock] = []
    for block_hash in block_hashes:
        block = cached_blocks.get(block_hash)
        if block is None:
            break
        blocks.append(block)
    return blocks


class BlockManager:
    """Block tables for every request that holds KV-cache memory.

    Invariants (checked by tests/test_block_manager.py):
      * a block's `ref_cnt` equals the number of block tables that contain it;
      * a request's table has enough blocks for every token it was allocated slots for;
      * the first `len(self._block_hashes[rid])` blocks of a table are full and committed, and
        `_block_hashes[rid][i]` is the chained hash of the request's tokens up to the end of
        block i (the block itself may be uncached when another block already held that hash);
      * a block a request is still writing to (not yet full and committed) is never shared.
    """

    def __init__(self, block_pool: BlockPool, block_size: int, enable_prefix_caching: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_pool = block_pool
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.block_tables: dict[str, list[KVCacheBlock]] = {}
        # Hash chain of each request's committed full blocks (its length: how many are committed).
        self._block_hashes: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    def get_block_table(self, request_id: str, start: int = 0) -> list[int]:
        """Block ids of the request's table, in token order (from block `start` on)."""
        return [block.block_id for block in self._table(request_id)[start:]]

    def num_held_blocks(self, request_id: str) -> int:
        """Blocks in the request's table (0: it holds none)."""
        return len(self.block_tables.get(request_id, ()))

    def get_computed_blocks(
        self, token_ids: Sequence[int], block_hashes: list[int] | None = None
    ) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of full blocks: (blocks, number of tokens they hold).  Never the
        whole prompt (the model must run on one token at least to get the next one's logits);
        ref counts unchanged (`allocate_slots` takes the references).

        `block_hashes`: the caller's chained hashes of `token_ids`' first blocks, extended here
        and kept by the caller, so a request that waits many steps hashes each block once.
        """
        if not self.enable_prefix_caching:
            return [], 0
        max_num_blocks = (len(token_ids) - 1) // self.block_size
        hashes = block_hashes if block_hashes is not None else []
        self._extend_hashes(hashes, token_ids, max_num_blocks)
        computed_blocks = cached_prefix(hashes[:max_num_blocks], MappingProxyType(self.block_pool.cached_blocks))
        return computed_blocks, len(computed_blocks) * self.block_size

    def can_allocate_slots(self, request_id: str, num_computed_tokens: int, num_new_tokens: int,
                           computed_blocks: Sequence[KVCacheBlock] = ()) -> bool:
        """Whether `allocate_slots` with the same arguments would succeed."""
        num_new_blocks = self.num_blocks_to_allocate(
            request_id, num_computed_tokens, num_new_tokens, computed_blocks)
        return self._fits(num_new_blocks, computed_blocks)

    def allocate_slots(self, request_id: str, num_computed_tokens: int, num_new_tokens: int,
                       computed_blocks: Sequence[KVCacheBlock] = ()) -> bool:
        """Make the request's table hold slots for `num_computed_tokens + num_new_tokens` tokens;
        False, and nothing changes, when the pool is short of blocks.

        `num_computed_tokens`: tokens whose KV is in the cache (on a request's first call, the
        tokens `computed_blocks` hold).  `computed_blocks`: the prefix hit, on the first call only
        (or the first after `free`); they are shared (`touch`) and head the table.
        """
        num_new_blocks = self.num_blocks_to_allocate(
            request_id, num_computed_tokens, num_new_tokens, computed_blocks)
        if not self._fits(num_new_blocks, computed_blocks):
            return False
        if request_id not in self.block_tables:
            # Touch before allocating, so that get_new_blocks cannot evict the hit blocks.
            self.block_pool.touch(computed_blocks)
            self.block_tables[request_id] = list(computed_blocks)
            self._block_hashes[request_id] = [block.block_hash for block in computed_blocks]
        self.block_tables[request_id].extend(self.block_pool.get_new_blocks(num_new_blocks))
        return True

    def num_free_blocks_beside(self, computed_blocks: Sequence[KVCacheBlock] = ()) -> int:
        """Free blocks left for new ones once the prefix hit `computed_blocks` is taken: a hit on
        a cached-free block takes it out of the free queue."""
        num_hits_on_free = sum(1 for block in computed_blocks if block.ref_cnt == 0)
        return self.block_pool.num_free_blocks - num_hits_on_free

    def _fits(self, num_new_blocks: int, computed_blocks: Sequence[KVCacheBlock]) -> bool:
        return num_new_blocks <= self.num_free_blocks_beside(computed_blocks)

    def num_blocks_to_allocate(self, request_id: str, num_computed_tokens: int, num_new_tokens: int,
                               computed_blocks: Sequence[KVCacheBlock] = ()) -> int:
        """How many new blocks `allocate_slots` with the same arguments takes from the pool (and
        ValueError if those arguments are inconsistent)."""
        if num_computed_tokens < 0 or num_new_tokens < 0:
            raise ValueError(f"token counts must be >= 0, got num_computed_tokens="
                             f"{num_computed_tokens}, num_new_tokens={num_new_tokens}")
        if request_id in self.block_tables:
            if computed_blocks:
                raise ValueError(f"request {request_id!r} already has a block table: "
                                 f"computed_blocks can only be passed on its first allocate_slots")
            num_held_blocks = len(self.block_tables[request_id])
            num_committed_tokens = len(self._block_hashes[request_id]) * self.block_size
            if num_computed_tokens < num_committed_tokens:
                # The new tokens would overwrite committed blocks, which others may be sharing.
                raise ValueError(f"request {request_id!r}: num_computed_tokens="
                                 f"{num_computed_tokens} is behind the {num_committed_tokens} "
                                 f"tokens already committed")
            if num_computed_tokens > num_held_blocks * self.block_size:
                raise ValueError(f"request {request_id!r} claims {num_computed_tokens} computed "
                                 f"tokens but its {num_held_blocks} blocks hold at most "
                                 f"{num_held_blocks * self.block_size}")
        else:
            num_held_blocks = len(computed_blocks)
            if num_computed_tokens != num_held_blocks * self.block_size:
                raise ValueError(f"new request {request_id!r}: num_computed_tokens must be the "
                                 f"{num_held_blocks * self.block_size} tokens held by its "
                                 f"{num_held_blocks} computed blocks, got {num_computed_tokens}")
            for block in computed_blocks:
                if self.block_pool.get_cached_block(block.block_hash) is not block:
                    raise ValueError(f"computed block {block.block_id} is no longer cached "
                                     f"(evicted since get_computed_blocks?); call it again")
        num_blocks_needed = cdiv(num_computed_tokens + num_new_tokens, self.block_size)
        return max(0, num_blocks_needed - num_held_blocks)

    def commit(self, request_id: str, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Record that the KV of the first `num_computed_tokens` tokens is written: every block now
        full and not yet committed is hashed (chaining its parent's) and offered to the prefix
        cache.  The same or a smaller count again does nothing."""
        table = self._table(request_id)
        if num_computed_tokens > len(token_ids):
            raise ValueError(f"num_computed_tokens={num_computed_tokens} exceeds the "
                             f"{len(token_ids)} token ids given")
        if num_computed_tokens > len(table) * self.block_size:
            raise ValueError(f"request {request_id!r} has slots for {len(table) * self.block_size} "
                             f"tokens, cannot commit {num_computed_tokens}")
        block_hashes = self._block_hashes[request_id]
        num_committed = len(block_hashes)
        # The chain grows even where the pool does not cache a block: the next hash needs it.
        self._extend_hashes(block_hashes, token_ids, num_computed_tokens // self.block_size)
        if self.enable_prefix_caching:
            for i in range(num_committed, len(block_hashes)):
                self.block_pool.cache_full_block(table[i], block_hashes[i])

    def _extend_hashes(self, hashes: list[int], token_ids: Sequence[int], num_blocks: int) -> None:
        """Extend the chain of `token_ids`' full-block hashes to `num_blocks` blocks."""
        for i in range(len(hashes), num_blocks):
            block_tokens = token_ids[i * self.block_size : (i + 1) * self.block_size]
            hashes.append(hash_block_tokens(hashes[-1] if hashes else None, block_tokens))

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        """Cache slot of each token position in [start, end) (`kv_cache_utils.slot_mapping`)."""
        table = self._table(request_id)
        if not 0 <= start <= end <= len(table) * self.block_size:
            raise ValueError(f"positions [{start}, {end}) out of range: request {request_id!r} "
                             f"has slots for positions [0, {len(table) * self.block_size})")
        return slot_mapping([block.block_id for block in table], self.block_size, start, end)

    def free(self, request_id: str) -> None:
        """Release the request's blocks and forget it (finished, aborted or preempted).

        Blocks are freed in REVERSE table order, so the tail blocks (this request's most specific
        tokens) are evicted before its head blocks (a shared system prompt: likely hit again).
        """
        table = self._table(request_id)
        self.block_pool.free_blocks(reversed(table))
        del self.block_tables[request_id]
        del self._block_hashes[request_id]

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Shrink the table to the blocks that hold its first `num_tokens` tokens; free the rest,
        tail first (rejected drafts' slots).  Committed blocks are never cut."""
        table = self._table(request_id)
        num_committed_tokens = len(self._block_hashes[request_id]) * self.block_size
        if num_tokens < num_committed_tokens:
            raise ValueError(f"request {request_id!r}: cannot trim to {num_tokens} tokens, "
                             f"{num_committed_tokens} are committed")
        num_kept = cdiv(num_tokens, self.block_size)
        if num_kept < len(table):
            self.block_pool.free_blocks(reversed(table[num_kept:]))
            del table[num_kept:]

    def _table(self, request_id: str) -> list[KVCacheBlock]:
        if request_id not in self.block_tables:
            raise KeyError(f"request {request_id!r} holds no blocks (never allocated, or already "
                           f"freed)")
        return self.block_tables[request_id]
