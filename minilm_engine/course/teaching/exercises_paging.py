"""Exercises of chapters 03 and 04: the arithmetic of paged KV memory and of the step budget.

Contract: each exercise's stored cases were answered by the engine's own code
(`scripts/make_exercise_fixtures.py`): `kv_cache_utils.slot_mapping` directly,
`BlockManager.get_computed_blocks` and `Scheduler.schedule` through the `engine_*` adapters
below, which build a real `BlockPool` / `BlockManager` / `Scheduler` holding exactly the case's
state; `solution()` shows the engine code itself.

    slot_mapping_exercise     (03) where does each token's K/V go?  block table -> cache slots
    cached_prefix_exercise    (03) which blocks of a new prompt are cached?  the hash chain
    prefill_chunks_exercise   (04) how is a long prompt cut while others decode?  the budget
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from minilm_engine.core.config import EngineConfig
from minilm_engine.core.scheduler import Scheduler
from minilm_engine.core.kv_cache_manager import BlockManager
from minilm_engine.core.block_pool import BlockPool, hash_block_tokens
from minilm_engine.core.request import Request
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.teaching.exercises import Exercise


# -- 1. slot mapping ----------------------------------------------------------------------------


def make_slot_mapping_case(rng: random.Random) -> dict[str, Any]:
    block_size = rng.choice([1, 2, 4, 8, 16])
    table = rng.sample(range(32), rng.randint(1, 6))
    capacity = len(table) * block_size
    start = rng.randint(0, capacity)
    end = rng.randint(start, capacity)
    return {"block_table": table, "block_size": block_size, "start": start, "end": end}


slot_mapping_exercise = Exercise(
    "slot_mapping",
    "slot_mapping",
    shows=("minilm_engine.core.kv_cache_utils:slot_mapping",),
    solutions="03_paged_memory_solutions.ipynb",
    hint=(
        "Position p lives in the (p // block_size)-th block of the table, at offset "
        "p % block_size inside it; a block with id b starts at slot b * block_size."
    ),
)


# -- 2. prefix-cache lookup -------------------------------------------------------------------


def engine_cached_prefix_blocks(
    token_ids: list[int], block_size: int, cached: dict[int, int]
) -> list[int]:
    """`BlockManager.get_computed_blocks` on a pool whose prefix cache maps hash -> block id as
    `cached` says; returns the ids of the blocks hit."""
    pool = BlockPool(max(cached.values(), default=0) + 1)
    pool.get_new_blocks(pool.num_blocks)  # every block in use, so none is evicted or reused
    for block_hash, block_id in cached.items():
        pool.cache_full_block(pool.blocks[block_id], block_hash)
    manager = BlockManager(pool, block_size)
    blocks, _ = manager.get_computed_blocks(token_ids)
    return [block.block_id for block in blocks]


def chain_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The chained hash of every full block of `token_ids` (what the cache is keyed by)."""
    hashes: list[int] = []
    for i in range(len(token_ids) // block_size):
        parent = hashes[-1] if hashes else None
        hashes.append(hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size]))
    return hashes


def make_cached_prefix_case(rng: random.Random) -> dict[str, Any]:
    """A prompt and a cache holding some of its blocks: a leading run, sometimes a later block
    whose parent was evicted, sometimes hashes of the same tokens without the chain."""
    block_size = rng.choice([2, 3, 4])
    num_blocks = rng.randint(0, 6)
    # Exact multiples of block_size often, to test "never the whole prompt".
    num_tokens = num_blocks * block_size + rng.choice([0, 0, 1, block_size - 1])
    num_tokens = max(num_tokens, 1)
    token_ids = [rng.randrange(6) for _ in range(num_tokens)]  # few values: repeated blocks
    hashes = chain_hashes(token_ids, block_size)
    ids = iter(rng.sample(range(40), 40))
    cached = {h: next(ids) for h in hashes[: rng.randint(0, len(hashes))]}
    if hashes and rng.random() < 0.4:  # a later block survived its evicted parent
        cached.setdefault(rng.choice(hashes), next(ids))
    if len(hashes) > 1 and rng.random() < 0.4:  # the same tokens as a first block: no chain
        j = rng.randrange(1, len(hashes))
        block_tokens = token_ids[j * block_size : (j + 1) * block_size]
        cached.setdefault(hash_block_tokens(None, block_tokens), next(ids))
    return {"token_ids": token_ids, "block_size": block_size, "cached": cached}


def _decode_cached_prefix(raw: dict[str, Any]) -> dict[str, Any]:
    """JSON keys are strings: the cache maps int hashes to block ids."""
    return {**raw, "cached": {int(h): block_id for h, block_id in raw["cached"].items()}}


cached_prefix_exercise = Exercise(
    "cached_prefix_blocks",
    "cached_prefix_blocks",
    decode=_decode_cached_prefix,
    shows=("minilm_engine.core.kv_cache_manager:BlockManager.get_computed_blocks",),
    package=("minilm_engine.course.teaching.exercises_paging:engine_cached_prefix_blocks",),
    solutions="03_paged_memory_solutions.ipynb",
    hint=(
        "Walk the full blocks in order with parent = None, then parent = "
        "hash_block_tokens(parent, block_tokens); look each hash up in `cached` and stop at "
        "the first miss. Leave at least one prompt token to compute: at most "
        "(len(token_ids) - 1) // block_size blocks."
    ),
)


# -- 3. chunked prefill (chapter 04) ----------------------------------------------------------


def engine_prefill_chunks(
    num_prompt_tokens: int, num_decoding: int, max_num_batched_tokens: int
) -> list[int]:
    """Prompt tokens the engine's `Scheduler` (chunked prefill on) computes in each step for a
    prompt that arrives while `num_decoding` requests are decoding (one token each per step)."""
    block_size = 16
    config = EngineConfig(
        max_num_seqs=num_decoding + 1, max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size, enable_prefix_caching=False, enable_chunked_prefill=True,
    )
    # Room for everything the run can hold, so memory never interferes with the budget.
    num_blocks = (num_decoding + 1) * (3 + num_prompt_tokens // block_size)
    pool = BlockPool(num_blocks, enable_caching=False)
    manager = BlockManager(pool, block_size, enable_prefix_caching=False)
    scheduler = Scheduler(config, manager)
    forever = SamplingParams(temperature=0, max_tokens=1 << 20, ignore_eos=True)

    def step() -> dict[str, int]:
        out = scheduler.schedule()
        scheduler.update_from_output(out)
        for s in out.scheduled:
            if s.samples_token:
                s.request.append_output_token(0)
        return {s.request.request_id: s.num_new_tokens for s in out.scheduled}

    def make(request_id: str, num_tokens: int) -> Request:
        return Request(request_id, None, [1] * num_tokens, forever, (), max_model_len=1 << 30)

    for i in range(num_decoding):  # one-token prompts: after one step they are all decoding
        scheduler.add_request(make(f"decode{i}", 1))
    if num_decoding:
        step()
    long = make("long", num_prompt_tokens)
    scheduler.add_request(long)
    chunks = []
    while not long.output_token_ids:
        chunks.append(step().get("long", 0))
    return chunks


def make_prefill_chunks_case(rng: random.Random) -> dict[str, Any]:
    num_decoding = rng.randint(0, 8)
    return {
        "num_prompt_tokens": rng.randint(1, 300),
        "num_decoding": num_decoding,
        "max_num_batched_tokens": rng.randint(num_decoding + 1, 64),
    }


prefill_chunks_exercise = Exercise(
    "prefill_chunks",
    "prefill_chunks",
    shows=(
        "minilm_engine.core.scheduler:Scheduler.schedule",
        "minilm_engine.core.schedule_step:num_tokens_to_compute",
    ),
    package=("minilm_engine.course.teaching.exercises_paging:engine_prefill_chunks",),
    solutions="04_prefill_vs_decode_solutions.ipynb",
    hint=(
        "Every step has max_num_batched_tokens tokens to give. Running requests are served "
        "first, oldest first: each decoding request takes 1. What is left goes to the prompt, "
        "until its last chunk, which may be smaller."
    ),
)
