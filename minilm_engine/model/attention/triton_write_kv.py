"""Triton kernel: write this step's keys and values into the paged KV cache.

Contract: `write_kv(k_cache, v_cache, k, v, slot_mapping)` does what `paged.write_kv_reference`
does: token i of the step goes to slot `slot_mapping[i]` (block `slot // block_size`, row
`slot % block_size`); nothing but the N named slots is touched.

One program instance copies one token, all of its K/V heads, for K and for V:

    k (N, H_kv, D)                              k_cache (num_blocks, block_size, H_kv, D)
    token i ──┐                                   block b = slot // block_size
      [h0: d0 .. dD]   ── slot_mapping[i] ──>       row r = slot % block_size
      [h1: d0 .. dD]                                  [h0: d0 .. dD]
                                                      [h1: d0 .. dD]

The tile is (BLOCK_H, BLOCK_D), powers of two, masked to the real (H_kv, D).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_k_token, stride_k_head, stride_v_token, stride_v_head,  # strides of k, v (D is 1)
    stride_cache_block, stride_cache_row, stride_cache_head,  # strides of both caches
    block_size, num_kv_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    # Where this token goes: the reference's `cache.view(-1, H_kv, D)[slot] = k` spelled out.
    slot = tl.load(slot_mapping_ptr + token)  # int64
    block, row = slot // block_size, slot % block_size

    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads[:, None] < num_kv_heads) & (dims[None, :] < head_dim)  # (BLOCK_H, BLOCK_D)

    k = tl.load(k_ptr + token * stride_k_token + heads[:, None] * stride_k_head + dims[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_v_token + heads[:, None] * stride_v_head + dims[None, :], mask=mask)
    dst = block * stride_cache_block + row * stride_cache_row + heads[:, None] * stride_cache_head + dims[None, :]
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v: (N, H_kv, D) -> stored at `slot_mapping` (N,) in caches of (num_blocks, block_size, H_kv, D)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1, "caches must share a layout"
    assert k.dtype == k_cache.dtype and v.dtype == v_cache.dtype, "k/v must have the cache's dtype"
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_cache.shape[1], num_kv_heads, head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )
