"""Triton kernel: paged attention for a decode step (one new query token per sequence).

Contract: `paged_decode_attention(q, k_cache, v_cache, meta)` returns what
`paged.paged_attention_reference` returns when every sequence has one query (row i of q):

    q (S, H, D)  k_cache, v_cache (num_blocks, block_size, H_kv, D)  ->  out (S, H, D)

A decode query sees all `context_lens[i]` cached keys (its own included): no causal mask, only
the end of the context.  Inputs fp16, bf16 or fp32; the arithmetic in fp32.

One program instance = one (sequence, K/V head) pair and ALL the query heads sharing that head
(grouped-query attention: G = H / H_kv query heads per K/V head, e.g. G = 5 for noodle-chef):

    block_table[seq] = [7, 2, 9]     block_size = 4, context_len = 10, BLOCK_N = 8
    token position:   0 1 2 3 | 4 5 6 7 | 8 9 . .
    lives in block:   7 7 7 7 | 2 2 2 2 | 9 9 . .      (each key looks up its own block)

    q tile (BLOCK_G, BLOCK_D)      key tile 0: positions 0..7    key tile 1: positions 8..15
      head kv*G + 0   ─┐           K (BLOCK_N, BLOCK_D)          K (BLOCK_N, BLOCK_D), 10.. masked
      head kv*G + 1    ├── scores (BLOCK_G, BLOCK_N) ── online softmax ── acc (BLOCK_G, BLOCK_D)
      ...             ─┘
      (rows >= G are padding, masked on load and store)

One program per K/V head: decode is bound by memory traffic, and a K/V tile loaded once serves
all G query heads.  Scores are a product summed over D, not `tl.dot` (whose tiles must be >= 16
wide; G is 1 to 8): decode has arithmetic to spare.  Few long contexts: `triton_paged_decode_split`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minilm_engine.pluggable import replaceable
from minilm_engine.model.attention.paged import PagedAttentionMetadata

BLOCK_N = 16  # keys per tile; a fixed size, since the interpreter cannot autotune


@triton.jit
def paged_decode_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    scale,
    stride_q_token, stride_q_head, stride_out_token, stride_out_head,  # D has stride 1 everywhere
    stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
    block_size, num_queries_per_kv, head_dim,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    context_len = tl.load(context_lens_ptr + seq)

    # 1. This sequence's query, for the G query heads that read K/V head `kv_head`
    #    (as in the reference `attention`: query head h uses K/V head h // G).
    group = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    heads = kv_head * num_queries_per_kv + group
    mask_g, mask_d = group < num_queries_per_kv, dims < head_dim
    q_mask = mask_g[:, None] & mask_d[None, :]
    q = tl.load(q_ptr + seq * stride_q_token + heads[:, None] * stride_q_head + dims[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32)  # (BLOCK_G, BLOCK_D)

    # 2. Online softmax over the keys, one tile of BLOCK_N positions at a time: m is the running
    #    maximum score of each row, l the running sum of exp(score - m), acc the running sum of
    #    exp(score - m) * value.  When a tile raises the maximum, the old sums are rescaled by
    #    exp(m_old - m_new), so after the last tile acc / l = softmax(scores) @ values exactly.
    m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    positions = tl.arange(0, BLOCK_N)
    for start in range(0, context_len, BLOCK_N):
        # 2a. Gather the tile's keys and values through the block table: the slots the
        #     reference's `_group` computes (masked at context_len), one position at a time.
        pos = start + positions
        mask_n = pos < context_len
        block = tl.load(block_tables_ptr + seq * stride_table_seq + pos // block_size, mask=mask_n, other=0)
        row_offset = block * stride_cache_block + (pos % block_size) * stride_cache_row + kv_head * stride_cache_head
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + row_offset[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + row_offset[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)

        # 2b. scores = q k^T / sqrt(D), (BLOCK_G, BLOCK_N); positions past the context get -inf.
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        scores = tl.where(mask_n[None, :], scores, float("-inf"))

        # 2c. Fold the tile into the running softmax.  The first tile always holds position 0,
        #     so m is finite from then on and exp(m - m_new) is never exp(-inf + inf) = NaN.
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)  # (BLOCK_G,) how much the old sums shrink
        p = tl.exp(scores - m_new[:, None])  # (BLOCK_G, BLOCK_N)
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new

    # 3. Normalise and store in the output's dtype, only the real heads and dims.
    out = acc / l[:, None]
    out_offset = seq * stride_out_token + heads[:, None] * stride_out_head + dims[None, :]
    tl.store(out_ptr + out_offset, out.to(out_ptr.dtype.element_ty), mask=q_mask)


@replaceable("attention.decode_kernel")
def decode_kernel():
    """The kernel `paged_decode_attention` launches: `paged_decode_kernel` (the seam through
    which another kernel of the same signature can be run in the engine, as `pluggable` says)."""
    return paged_decode_kernel


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedAttentionMetadata
) -> torch.Tensor:
    """q: (S, H, D), one query per sequence -> (S, H, D)."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    assert num_seqs == meta.num_seqs, "decode: exactly one query token per sequence"
    assert num_heads % num_kv_heads == 0 and k_cache.stride() == v_cache.stride()
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty((num_seqs, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out
    num_queries_per_kv = num_heads // num_kv_heads
    decode_kernel()[(num_seqs, num_kv_heads)](
        out, q, k_cache, v_cache, meta.block_tables, meta.context_lens,
        head_dim**-0.5,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0),
        k_cache.shape[1], num_queries_per_kv, head_dim,
        BLOCK_G=triton.next_power_of_2(num_queries_per_kv),
        BLOCK_N=BLOCK_N,
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
    return out
