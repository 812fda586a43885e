"""What the paged decode kernel must read, and how fast it reads it.

Contract: plain arithmetic and a few measuring helpers around `model/attention/triton_paged_decode`
(appendix A1; its exercise is in `course/teaching/exercises_kernels.py`).  Nothing here imports triton
at module level: the kernels are imported inside the functions that run them, so a caller can
still switch on the interpreter (TRITON_INTERPRET=1) before triton is first imported.

    decode_kv_bytes(num_seqs, context_len, num_kv_heads, head_dim, dtype)
        bytes of K and V one decode step reads in one layer: each (sequence, K/V head) program
        reads its context once, whatever the number of query heads sharing it
    decode_traffic(...) -> DecodeTraffic        K/V + q read, output written
    decode_arithmetic_intensity(num_heads, num_kv_heads, dtype)    FLOPs per byte of K/V
    key_locations(block_table, block_size, context_len)   where the kernel finds each key
    online_softmax(scores, values, block_n)     the kernel's running max / sum, tile by tile
    random_paged_batch(...) -> PagedBatch       a random decode step in a shuffled, NaN-guarded pool
    with_contiguous_blocks(batch)               the same step, blocks renumbered in token order
    time_decode_kernel(batch)                   seconds per kernel call (do_bench on a GPU)
    measure_decode_bandwidth(...)               achieved bytes/s of the kernel (meant for a GPU)

A decode step is memory-bound: per key position and K/V head the kernel loads 2 * D numbers
(a key and a value) and does 4 * G * D FLOPs with them (G query heads, q.k and p*v), so it does
2 * G / bytes_per_element FLOPs per byte read, a few, where a GPU can do hundreds.  The best it
can do is read the bytes at the card's memory bandwidth:

    time >= decode_traffic(...).read_bytes / memory_bandwidth
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, replace

import torch

from minilm_engine.model.attention.paged import PagedAttentionMetadata
from minilm_engine.core.kv_cache_utils import cdiv, slot_mapping

# -- byte counts ---------------------------------------------------------------------------


def decode_kv_bytes(
    num_seqs: int, context_len: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes of keys and values one decode step reads in one layer.

    Every sequence's `context_len` cached tokens, for each K/V head, a key and a value of
    `head_dim` elements each.  The query heads of a GQA group share one read: the number of
    query heads does not appear.
    """
    return 2 * num_seqs * context_len * num_kv_heads * head_dim * dtype.itemsize


@dataclass(frozen=True)
class DecodeTraffic:
    """Bytes one decode step of the kernel moves in one layer."""

    kv_bytes: int  # keys and values read (the bulk)
    q_bytes: int  # one query per sequence, every query head
    out_bytes: int  # the output written, as large as q

    @property
    def read_bytes(self) -> int:
        return self.kv_bytes + self.q_bytes


def decode_traffic(
    num_seqs: int, context_len: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> DecodeTraffic:
    """K/V and q read and output written by one decode step, all sequences at `context_len`.

    (The block table and context lengths, a few int64 per block, are left out: at block_size 16
    and head_dim 128 in bf16 they are under 0.2% of the K/V bytes.)
    """
    q_bytes = num_seqs * num_heads * head_dim * dtype.itemsize
    kv_bytes = decode_kv_bytes(num_seqs, context_len, num_kv_heads, head_dim, dtype)
    return DecodeTraffic(kv_bytes, q_bytes, q_bytes)


def decode_arithmetic_intensity(num_heads: int, num_kv_heads: int, dtype: torch.dtype) -> float:
    """FLOPs per byte of K/V read: 4 * G * D FLOPs for 2 * D elements, G = H / H_kv."""
    group = num_heads // num_kv_heads
    return 2 * group / dtype.itemsize


# -- the block-table gather ----------------------------------------------------------------


def key_locations(block_table: list[int], block_size: int, context_len: int) -> list[tuple[int, int, int]]:
    """(position, block, row) of each key, the way the kernel computes them (step 2a).

    Position p of the sequence lives in block `block_table[p // block_size]`, row
    `p % block_size`: the kernel loads the block id once per key and adds the strides.
    """
    return [(p, block_table[p // block_size], p % block_size) for p in range(context_len)]


# -- online softmax, one row ---------------------------------------------------------------


@dataclass(frozen=True)
class OnlineSoftmaxStep:
    """The running state after one key tile (the kernel's m, l and acc for one query head)."""

    tile: int
    tile_max: float  # the largest score in this tile
    m: float  # running maximum after the tile
    alpha: float  # exp(m_old - m_new): how much the old sums shrank
    l: float  # running sum of exp(score - m)
    acc: torch.Tensor  # (D,) running sum of exp(score - m) * value


def online_softmax(
    scores: torch.Tensor, values: torch.Tensor, block_n: int
) -> tuple[torch.Tensor, list[OnlineSoftmaxStep]]:
    """softmax(scores) @ values, one tile of `block_n` keys at a time, as the kernel's step 2c.

    scores: (L,) one query head's scores over L keys; values: (L, D).  Returns the output (D,)
    and the state after every tile, so the rescaling can be read step by step.
    """
    m, l = float("-inf"), 0.0
    acc = torch.zeros(values.shape[1], dtype=torch.float64)
    steps = []
    for tile, start in enumerate(range(0, scores.shape[0], block_n)):
        s = scores[start : start + block_n].double()
        m_new = max(m, float(s.max()))
        alpha = math.exp(m - m_new)  # exp(-inf) = 0 on the first tile: nothing to rescale
        p = torch.exp(s - m_new)  # (block_n,)
        l = l * alpha + float(p.sum())
        acc = acc * alpha + p @ values[start : start + block_n].double()
        m = m_new
        steps.append(OnlineSoftmaxStep(tile, float(s.max()), m, alpha, l, acc.clone()))
    return (acc / l).to(values.dtype), steps


# -- a random decode step ------------------------------------------------------------------


@dataclass
class PagedBatch:
    """A decode step: one query per sequence, the caches holding every sequence's context."""

    q: torch.Tensor  # (S, H, D)
    k_cache: torch.Tensor  # (num_blocks, block_size, H_kv, D)
    v_cache: torch.Tensor
    meta: PagedAttentionMetadata

    @property
    def num_seqs(self) -> int:
        return self.q.shape[0]

    def traffic(self) -> DecodeTraffic:
        """Bytes the decode kernel moves for this batch, summed over its real context lengths."""
        num_kv_heads, head_dim = self.k_cache.shape[2], self.k_cache.shape[3]
        total_context = int(self.meta.context_lens.sum())  # as one sequence of all their tokens
        kv_bytes = decode_kv_bytes(1, total_context, num_kv_heads, head_dim, self.q.dtype)
        q_bytes = self.q.numel() * self.q.element_size()
        return DecodeTraffic(kv_bytes, q_bytes, q_bytes)


def random_paged_batch(
    context_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    num_spare_blocks: int = 2,
) -> PagedBatch:
    """A decode step over `len(context_lens)` sequences, their blocks shuffled across the pool.

    Every slot no sequence owns (spare blocks, the tail of each last block) holds NaN: a kernel
    that reads one returns NaN, so a wrong gather cannot go unnoticed.
    """
    rng = random.Random(seed)
    # Drawn on the target device, in the target dtype: a GPU batch can hold gigabytes of K/V.
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_needed = [cdiv(n, block_size) for n in context_lens]
    num_blocks = sum(blocks_needed) + num_spare_blocks
    ids = rng.sample(range(num_blocks), num_blocks)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    v_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    owned = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    tables = torch.zeros(len(context_lens), max(blocks_needed, default=1), dtype=torch.int64)
    slots = []
    for i, (context_len, n) in enumerate(zip(context_lens, blocks_needed)):
        table, ids = ids[:n], ids[n:]
        tables[i, :n] = torch.tensor(table)
        for j, block in enumerate(table):  # the whole blocks, then the last one's real rows
            rows = min(block_size, context_len - j * block_size)
            owned[block * block_size : block * block_size + rows] = True
        slots += slot_mapping(table, block_size, context_len - 1, context_len)  # the new token's
    unowned = ~owned.view(num_blocks, block_size).to(device)
    k_cache[unowned] = float("nan")
    v_cache[unowned] = float("nan")
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=gen, device=device, dtype=dtype)
    meta = PagedAttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.arange(len(context_lens) + 1, dtype=torch.int64, device=device),
        context_lens=torch.tensor(context_lens, dtype=torch.int64, device=device),
        block_tables=tables.to(device),
    )
    return PagedBatch(q, k_cache, v_cache, meta)


def with_contiguous_blocks(batch: PagedBatch) -> PagedBatch:
    """The same step with each sequence's blocks renumbered 0, 1, 2, ... in token order."""
    tables = batch.meta.block_tables
    block_size = batch.k_cache.shape[1]
    used = [tables[i, : -(-int(n) // block_size)] for i, n in enumerate(batch.meta.context_lens.tolist())]
    order = torch.cat(used)  # old block ids, in the new order
    new_tables = torch.zeros_like(tables)
    start = 0
    for i, blocks in enumerate(used):
        new_tables[i, : len(blocks)] = torch.arange(start, start + len(blocks))
        start += len(blocks)
    meta = replace(batch.meta, block_tables=new_tables)
    return PagedBatch(batch.q, batch.k_cache[order].clone(), batch.v_cache[order].clone(), meta)


# -- timing --------------------------------------------------------------------------------


def time_decode_kernel(batch: PagedBatch, num_repeats: int = 20) -> float:
    """Median seconds of one `paged_decode_attention` call on `batch` (after a warm-up call).

    On a GPU, `triton.testing.do_bench`: CUDA events around about 100 ms of calls, the L2 cache
    cleared before each, so K/V come from memory (`num_repeats` is not used there); elsewhere,
    wall-clock medians of `num_repeats` calls.
    """
    from minilm_engine.model.attention.triton_paged_decode import paged_decode_attention

    def run():
        return paged_decode_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta)

    if batch.q.is_cuda:
        import triton.testing

        return triton.testing.do_bench(run, return_mode="median") / 1e3  # ms -> s
    run()
    times = []
    for _ in range(num_repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass(frozen=True)
class DecodeBandwidth:
    context_len: int
    num_seqs: int
    read_bytes: int  # K/V + q
    seconds: float  # one kernel call, median

    @property
    def bytes_per_s(self) -> float:
        return self.read_bytes / self.seconds


def measure_decode_bandwidth(
    context_lens: list[int],
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cuda",
    block_size: int = 16,
    num_repeats: int = 20,
) -> list[DecodeBandwidth]:
    """The kernel's achieved read bandwidth for `num_seqs` sequences at each context length."""
    results = []
    for context_len in context_lens:
        batch = random_paged_batch(
            [context_len] * num_seqs, num_heads, num_kv_heads, head_dim, block_size, dtype, device
        )
        seconds = time_decode_kernel(batch, num_repeats)
        results.append(DecodeBandwidth(context_len, num_seqs, batch.traffic().read_bytes, seconds))
        del batch
    return results
