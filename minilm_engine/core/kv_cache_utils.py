"""The block arithmetic, written once: how many blocks hold n tokens, and which cache slot holds
each token position.  Pure functions on plain ints, shared by the KV cache manager, the worker's
block tables, the CUDA-graph padding, the exercises and the measuring code.

    block_size = 4, block_table = [7, 2, 5]

    position   0  1  2  3 |  4  5  6  7 |  8  9
    block      ─── 7 ──── | ─── 2 ───── | ─── 5 ──
    slot      28 29 30 31 |  8  9 10 11 | 20 21      slot = block_table[p // block_size] * block_size
                                                            + p % block_size
"""

from __future__ import annotations

from collections.abc import Sequence

from minilm_engine.pluggable import replaceable


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many blocks of size b hold a tokens."""
    return -(-a // b)


@replaceable("kv_cache.slot_mapping")
def slot_mapping(block_table: Sequence[int], block_size: int, start: int, end: int) -> list[int]:
    """Cache slot of each token position in [start, end) of a sequence with `block_table`.

    The caller checks that the table is long enough (`end <= len(block_table) * block_size`).
    """
    return [
        block_table[position // block_size] * block_size + position % block_size
        for position in range(start, end)
    ]
