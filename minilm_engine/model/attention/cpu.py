"""The CPU attention backend: attention that costs what its FLOPs and its keys cost.

Contract: `CpuBackend` is an `AttentionBackend` (`backends.py`) whose `attend` gives what the
torch reference (`paged.paged_attention_reference`) gives, to float rounding, for any step.  It
is what "auto" runs on a CPU.  Its plan (`CpuPlan`) is built once per step from the host copies.

    K/V write                `write_kv` (cpu_paged_decode.cpp): a copy per token into its slot
    decodes (1 query each)   `paged_decode` (cpu_paged_decode.cpp): each key and value read once
                             where it lies in its block, all decodes in one call, long contexts
                             split into parts across the threads; without the compiled kernel,
                             SDPA over a copy of their keys
    prompts and chunks       per sequence, torch's SDPA (a flash kernel: the T x L scores are
                             never written) over its blocks, causal from the bottom right

Why: the reference writes every head's (T, L) scores in float32 (256 MiB per layer for a
2048-token prompt on Qwen3-0.6B) and copies a decode batch's keys into a padded tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from minilm_engine.model.attention import cpu_compiled
from minilm_engine.model.attention.backends import AttentionBackend
from minilm_engine.model.attention.paged import PagedAttentionMetadata, write_kv_reference

KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # what cpu_paged_decode.cpp reads


@dataclass(frozen=True)
class DecodeGroup:
    """The step's decodes: `rows` (S,) their query rows, in order; `block_tables` (S, W) and
    `context_lens` (S,) int64, contiguous, as `paged_decode` reads them."""

    rows: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor


@dataclass(frozen=True)
class Chunk:
    """One sequence with several queries: rows start .. start + num_queries - 1 of the step,
    the last `num_queries` of its `context_len` tokens, which lie in blocks `block_ids`."""

    start: int
    num_queries: int
    context_len: int
    block_ids: torch.Tensor


@dataclass(frozen=True)
class CpuPlan:
    meta: PagedAttentionMetadata
    block_size: int
    num_kv_heads: int
    decodes: DecodeGroup | None
    chunks: list[Chunk]
    covers_all_rows: bool  # one decode per row, in order: the decodes' output is the step's


def plan_cpu_attention(meta: PagedAttentionMetadata, block_size: int, num_kv_heads: int) -> CpuPlan:
    host = meta.on_host()
    num_queries = host.num_queries
    decodes = np.flatnonzero(num_queries == 1)
    group = None
    if len(decodes):
        lens = host.context_lens[decodes]
        width = int(-(-lens.max() // block_size))
        group = DecodeGroup(
            torch.from_numpy(host.query_start_loc[decodes].astype(np.int64)),
            torch.from_numpy(np.ascontiguousarray(host.block_tables[decodes, :width], dtype=np.int64)),
            torch.from_numpy(np.ascontiguousarray(lens, dtype=np.int64)),
        )
    chunks = []
    for s in np.flatnonzero(num_queries > 1):
        length = int(host.context_lens[s])
        ids = host.block_tables[s, : -(-length // block_size)]
        chunks.append(Chunk(int(host.query_start_loc[s]), int(num_queries[s]), length,
                            torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64))))
    return CpuPlan(meta, block_size, num_kv_heads, group, chunks, covers_all_rows=not chunks)


def _blocks(cache: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
    """(num_blocks, block_size, H_kv, D) -> the first `length` tokens of `block_ids`, (H_kv, length, D)."""
    rows = cache.index_select(0, block_ids).flatten(0, 1)[:length]  # (length, H_kv, D)
    return rows.transpose(0, 1)


def _attend_chunk(q: torch.Tensor, k_cache, v_cache, chunk: Chunk) -> torch.Tensor:
    """q: (T, H, D) of one sequence -> (T, H, D), over its cached tokens, causal."""
    k = _blocks(k_cache, chunk.block_ids, chunk.context_len)[None]  # (1, H_kv, L, D)
    v = _blocks(v_cache, chunk.block_ids, chunk.context_len)[None]
    T, L = chunk.num_queries, chunk.context_len
    # A whole prompt is plain causal; a chunk after a cached prefix is causal from the bottom
    # right (query t sits at position L - T + t).
    mask = dict(is_causal=True) if T == L else dict(attn_mask=causal_lower_right(T, L))
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k, v, enable_gqa=True, **mask)
    return out[0].transpose(0, 1)


def _attend_decodes_sdpa(q: torch.Tensor, k_cache, v_cache, group: DecodeGroup) -> torch.Tensor:
    """The decodes without the compiled kernel: q (S, H, D) -> (S, H, D) by SDPA over a copy of
    their keys and values, padded with each sequence's first (real) one and masked (a slot
    nobody wrote may hold NaN, which a zero weight would let through)."""
    num_seqs, _ = group.block_tables.shape
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    L = int(group.context_lens.max())
    pos = torch.arange(L)[None, :]  # (1, L)
    valid = pos < group.context_lens[:, None]  # (S, L)
    pos = torch.where(valid, pos, 0)
    slots = group.block_tables.gather(1, pos // block_size) * block_size + pos % block_size  # (S, L)
    shape = (num_seqs, L, num_kv_heads, head_dim)
    k = k_cache.view(-1, num_kv_heads, head_dim).index_select(0, slots.flatten()).view(shape)
    v = v_cache.view(-1, num_kv_heads, head_dim).index_select(0, slots.flatten()).view(shape)
    out = F.scaled_dot_product_attention(
        q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), attn_mask=valid[:, None, None], enable_gqa=True)
    return out[:, :, 0]


class CpuBackend(AttentionBackend):
    """`micro`: the compiled module, or None (decodes then run SDPA over a copy of their keys)."""

    name = "cpu"

    def __init__(self, micro=None):
        self.micro = micro

    def plan(self, meta: PagedAttentionMetadata, block_size: int, num_kv_heads: int) -> CpuPlan:
        return plan_cpu_attention(meta, block_size, num_kv_heads)

    def write_kv(self, k_cache, v_cache, k, v, slot_mapping: torch.Tensor) -> None:
        """k, v: (N, H_kv, D) -> their slots, by the compiled copy where it reads them (heads
        dense, the cache's dtype), else the reference's indexing."""
        dense = all(x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] for x in (k, v))
        if (self.micro is not None and dense and k.dtype == k_cache.dtype == v.dtype and k_cache.is_contiguous()
                and v_cache.is_contiguous() and slot_mapping.dtype == torch.int64):
            self.micro.write_kv(k_cache, v_cache, k, v, slot_mapping)
        else:
            write_kv_reference(k_cache, v_cache, k, v, slot_mapping)

    def _decodes(self, q, k_cache, v_cache, group: DecodeGroup) -> torch.Tensor:
        if self.micro is not None and q.dtype in KERNEL_DTYPES and k_cache.is_contiguous():
            return self.micro.paged_decode(q.contiguous(), k_cache, v_cache, group.block_tables, group.context_lens)
        return _attend_decodes_sdpa(q, k_cache, v_cache, group)

    def _attend(self, q, k_cache, v_cache, plan: CpuPlan) -> torch.Tensor:
        if plan.covers_all_rows:  # a pure decode step: rows 0..N-1 in order
            return self._decodes(q, k_cache, v_cache, plan.decodes)
        out = torch.empty_like(q)
        if plan.decodes is not None:
            out[plan.decodes.rows] = self._decodes(q[plan.decodes.rows], k_cache, v_cache, plan.decodes)
        for chunk in plan.chunks:
            rows = slice(chunk.start, chunk.start + chunk.num_queries)
            out[rows] = _attend_chunk(q[rows], k_cache, v_cache, chunk)
        return out


def make_cpu_backend() -> CpuBackend:
    """The CPU backend, with the compiled decode kernel where it builds (else `cpu_compiled`
    says why, once)."""
    return CpuBackend(cpu_compiled.load())
