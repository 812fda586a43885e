"""Triton kernels: paged decode attention with each context split into partitions ("flash decoding").

Contract: `paged_decode_split_attention(q, k_cache, v_cache, meta)` returns what
`triton_paged_decode.paged_decode_attention` returns; `should_split(...)` says when it is faster.

Why: the plain kernel runs one program per (sequence, K/V head): 8 for Qwen3-0.6B at batch 1,
on a GPU with 132 SMs.  Here every (sequence, K/V head, partition of PARTITION_SIZE tokens) is a
program, and a second kernel merges the partial results:

    context of one sequence:  [ partition 0 | partition 1 | partition 2 (partial) ]
    pass 1, one program each:  m0, l0, acc0    m1, l1, acc1    m2, l2, acc2
                               (running max, sum of exp, weighted sum of values: the plain
                               kernel's online softmax, stopped at the partition's end)
    pass 2, per query head:    M = max(m_p)
                               out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p

(the plain kernel's rescaling, once per partition).  The partition loop repeats the plain
kernel's, so that kernel stays one self-contained program to read.  The grid is sized from
`block_tables.shape[1]` (no host sync: a CUDA graph can record it); partitions past a context
return at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minilm_engine.model.attention.paged import PagedAttentionMetadata

PARTITION_SIZE = 128  # tokens per partition (a multiple of BLOCK_N)
BLOCK_N = 16  # keys per tile, as in the plain decode kernel


@triton.jit
def paged_decode_partition_kernel(
    acc_ptr, m_ptr, l_ptr,  # partial results: (S, H, P, D), (S, H, P), (S, H, P) float32
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    scale,
    stride_q_token, stride_q_head,
    stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
    block_size, num_queries_per_kv, head_dim, num_heads, max_partitions,
    PARTITION_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    start = part * PARTITION_SIZE
    if start >= context_len:
        return  # this sequence is shorter: the merge never reads this partition
    end = tl.minimum(start + PARTITION_SIZE, context_len)

    # 1. The query of the G heads sharing `kv_head`, as in the plain kernel.
    group = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    heads = kv_head * num_queries_per_kv + group
    mask_g, mask_d = group < num_queries_per_kv, dims < head_dim
    q_mask = mask_g[:, None] & mask_d[None, :]
    q = tl.load(q_ptr + seq * stride_q_token + heads[:, None] * stride_q_head + dims[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32)

    # 2. Online softmax over this partition's keys only.  Its first tile holds position
    #    `start` < context_len, so m is finite after it.
    m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    positions = tl.arange(0, BLOCK_N)
    for tile_start in range(start, end, BLOCK_N):
        pos = tile_start + positions
        mask_n = pos < end
        block = tl.load(block_tables_ptr + seq * stride_table_seq + pos // block_size, mask=mask_n, other=0)
        row_offset = block * stride_cache_block + (pos % block_size) * stride_cache_row + kv_head * stride_cache_head
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + row_offset[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + row_offset[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        scores = tl.where(mask_n[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new

    # 3. Store the partition's (m, l, acc) unnormalised, for the merge.
    row = (seq * num_heads + heads) * max_partitions + part  # (BLOCK_G,) index into (S, H, P)
    tl.store(m_ptr + row, m, mask=mask_g)
    tl.store(l_ptr + row, l, mask=mask_g)
    tl.store(acc_ptr + row[:, None] * head_dim + dims[None, :], acc, mask=q_mask)


@triton.jit
def paged_decode_merge_kernel(
    out_ptr, acc_ptr, m_ptr, l_ptr, context_lens_ptr,
    stride_out_token, stride_out_head,
    head_dim, num_heads, max_partitions,
    PARTITION_SIZE: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    context_len = tl.load(context_lens_ptr + seq)
    num_partitions = tl.cdiv(context_len, PARTITION_SIZE)
    base = (seq * num_heads + head) * max_partitions
    # The largest partition maximum first, so that every exp below is <= 1.
    m_max = tl.load(m_ptr + base)
    for part in range(1, num_partitions):
        m_max = tl.maximum(m_max, tl.load(m_ptr + base + part))
    dims = tl.arange(0, BLOCK_D)
    mask_d = dims < head_dim
    total = tl.zeros([BLOCK_D], dtype=tl.float32)
    weight_sum = tl.sum(tl.zeros([BLOCK_D], dtype=tl.float32), axis=0)  # a float32 zero
    for part in range(0, num_partitions):
        weight = tl.exp(tl.load(m_ptr + base + part) - m_max)  # rescales partition `part`
        weight_sum += weight * tl.load(l_ptr + base + part)
        total += weight * tl.load(acc_ptr + (base + part) * head_dim + dims, mask=mask_d, other=0.0)
    out = total / weight_sum
    tl.store(out_ptr + seq * stride_out_token + head * stride_out_head + dims, out.to(out_ptr.dtype.element_ty), mask=mask_d)


def should_split(num_seqs: int, num_kv_heads: int, max_context: int, num_sms: int) -> bool:
    """Split when the plain kernel's programs cannot fill the GPU and contexts span partitions."""
    return num_seqs * num_kv_heads < num_sms and max_context > PARTITION_SIZE


def paged_decode_split_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedAttentionMetadata
) -> torch.Tensor:
    """q: (S, H, D), one query per sequence -> (S, H, D)."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    assert num_seqs == meta.num_seqs, "decode: exactly one query token per sequence"
    assert num_heads % num_kv_heads == 0 and k_cache.stride() == v_cache.stride()
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty((num_seqs, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out
    # Every context fits its block table: a bound known on the host, no sync needed.
    max_partitions = triton.cdiv(meta.block_tables.shape[1] * block_size, PARTITION_SIZE)
    acc = torch.empty((num_seqs, num_heads, max_partitions, head_dim), dtype=torch.float32, device=q.device)
    m = torch.empty((num_seqs, num_heads, max_partitions), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    num_queries_per_kv = num_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    paged_decode_partition_kernel[(num_seqs, num_kv_heads, max_partitions)](
        acc, m, l, q, k_cache, v_cache, meta.block_tables, meta.context_lens,
        head_dim**-0.5,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0),
        block_size, num_queries_per_kv, head_dim, num_heads, max_partitions,
        PARTITION_SIZE=PARTITION_SIZE, BLOCK_G=triton.next_power_of_2(num_queries_per_kv),
        BLOCK_N=BLOCK_N, BLOCK_D=block_d,
    )
    paged_decode_merge_kernel[(num_seqs, num_heads)](
        out, acc, m, l, meta.context_lens,
        out.stride(0), out.stride(1),
        head_dim, num_heads, max_partitions,
        PARTITION_SIZE=PARTITION_SIZE, BLOCK_D=block_d,
    )
    return out
