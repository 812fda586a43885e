"""Triton kernel: paged attention for prompt chunks that continue after a cached prefix.

Contract: `paged_prefill_attention(q, k_cache, v_cache, meta)` returns what
`paged.paged_attention_reference` returns for any step (prompts, chunks after a cached prefix,
decodes).  Sequence i's T queries (rows `query_start_loc[i]` on) are the last T of its
`context_lens[i] = L` tokens, all already in the cache; the query at position p sees keys 0..p.

    q (N, H, D)  k_cache, v_cache (num_blocks, block_size, H_kv, D)  ->  out (N, H, D)

One program instance = one (sequence, tile of BLOCK_M queries, query head):

    sequence with L = 11 tokens, T = 5 new ones (positions 6..10), BLOCK_M = BLOCK_N = 4

                     key positions (read through the block table, tile by tile)
                      0 1 2 3 | 4 5 6 7 | 8 9 10 .
    query tile 0  p=6 x x x x | x x x . | . . .  .     x = attended (key <= query position)
                  p=7 x x x x | x x x x | . . .  .     . = masked to -inf
                  p=8 x x x x | x x x x | x . .  .
                  p=9 x x x x | x x x x | x x .  .
    query tile 1  p=10  ...   |   ...   | x x x  .     (tile 1 has one real row; the 3 others
                                                         are padding, never stored)

Per key tile: scores with `tl.dot`, the causal mask, the online-softmax update (as in
`triton_paged_decode`); a query tile stops at the key tile of its last query.  One program per
query head (decode has one per K/V head): prefill is bound by arithmetic, not by reading K/V.
`tl.dot` needs tiles of at least 16, hence BLOCK_M = BLOCK_N = 16 and D padded to >= 16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minilm_engine.model.attention.paged import PagedAttentionMetadata

BLOCK_M = 16  # queries per tile
BLOCK_N = 16  # keys per tile; fixed sizes, since the interpreter cannot autotune


@triton.jit
def paged_prefill_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, query_start_loc_ptr,
    scale,
    stride_q_token, stride_q_head, stride_out_token, stride_out_head,  # D has stride 1 everywhere
    stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
    block_size, num_queries_per_kv, head_dim,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_FP32: tl.constexpr,
):
    seq = tl.program_id(0)
    tile = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    num_queries = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= num_queries:
        return  # the grid is sized for the longest chunk of the step; this one is shorter
    context_len = tl.load(context_lens_ptr + seq)
    kv_head = head // num_queries_per_kv  # query head h uses K/V head h // group, as in `attention`

    # 1. The query tile: queries tile*BLOCK_M .. of this sequence's chunk, and their positions
    #    (the reference's `query_pos = arange(context_len - num_queries, context_len)`).
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    mask_m, mask_d = rows < num_queries, dims < head_dim
    query_pos = context_len - num_queries + rows  # (BLOCK_M,)
    q_mask = mask_m[:, None] & mask_d[None, :]
    q_offset = (q_start + rows)[:, None] * stride_q_token + head * stride_q_head + dims[None, :]
    q = tl.load(q_ptr + q_offset, mask=q_mask, other=0.0)  # (BLOCK_M, BLOCK_D)
    if DOT_FP32:
        q = q.to(tl.float32)

    # 2. Online softmax over key tiles, as in the decode kernel, with a causal mask.  Keys past
    #    the last query of this tile are masked for every row, so the loop stops there.
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    positions = tl.arange(0, BLOCK_N)
    kv_end = tl.minimum(context_len, context_len - num_queries + (tile + 1) * BLOCK_M)
    for start in range(0, kv_end, BLOCK_N):
        # 2a. Gather keys/values of positions start .. start+BLOCK_N-1 through the block table.
        pos = start + positions
        mask_n = pos < context_len
        block = tl.load(block_tables_ptr + seq * stride_table_seq + pos // block_size, mask=mask_n, other=0)
        row_offset = block * stride_cache_block + (pos % block_size) * stride_cache_row + kv_head * stride_cache_head
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + row_offset[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + row_offset[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if DOT_FP32:
            k, v = k.to(tl.float32), v.to(tl.float32)

        # 2b. scores (BLOCK_M, BLOCK_N) in fp32: fp16/bf16 products are exact in fp32, and
        #     "ieee" keeps fp32 inputs from being rounded to TF32 on the tensor cores.
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        visible = (pos[None, :] <= query_pos[:, None]) & mask_n[None, :]  # the reference's mask
        scores = tl.where(visible, scores, float("-inf"))

        # 2c. Online softmax.  Every row (padding rows too: their position is >= context_len)
        #     sees key 0 in the first tile, so m is finite after it and no NaN appears.
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])  # (BLOCK_M, BLOCK_N)
        l = l * alpha + tl.sum(p, axis=1)
        # Like the reference (`probs.to(q.dtype) @ v`), the weights meet the values in their dtype.
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m = m_new

    # 3. Normalise and store the real rows.
    out = acc / l[:, None]
    out_offset = (q_start + rows)[:, None] * stride_out_token + head * stride_out_head + dims[None, :]
    tl.store(out_ptr + out_offset, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def is_interpreted() -> bool:
    """Whether these kernels were compiled for the CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return type(paged_prefill_kernel).__name__ == "InterpretedFunction"


def paged_prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedAttentionMetadata
) -> torch.Tensor:
    """q: (N, H, D) flattened queries -> (N, H, D), each sequence over its own cached tokens."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    assert num_heads % num_kv_heads == 0 and k_cache.stride() == v_cache.stride()
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    # The grid needs the longest chunk.  The model runner knows it on the host; computing it
    # here from device tensors would make the CPU wait for the GPU, once per layer.
    max_num_queries = meta.max_query_len
    if max_num_queries is None:
        max_num_queries = int((meta.query_start_loc[1:] - meta.query_start_loc[:-1]).max())
    grid = (meta.num_seqs, triton.cdiv(max_num_queries, BLOCK_M), num_heads)
    paged_prefill_kernel[grid](
        out, q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.query_start_loc,
        head_dim**-0.5,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0),
        k_cache.shape[1], num_heads // num_kv_heads, head_dim,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        # The interpreter computes bf16 dots wrongly (numpy has no bf16): upcast there only.
        DOT_FP32=q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and is_interpreted()),
    )
    return out
