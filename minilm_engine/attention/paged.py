"""Paged attention: a step's metadata, the KV write and the readable reference.

Contract: `PagedAttentionMetadata` says where a step's new keys/values go and what each sequence
may look at; `write_kv_reference` stores them and `paged_attention_reference` attends, over
caches of (num_blocks, block_size, H_kv, D) per layer.  These are the definitions the Triton
kernels next to them (`triton_*.py`) are tested against.  All sequences of a step are flattened
into one row of tokens (no padding), prefill chunks and single decode tokens side by side:

    flattened queries:  [ A0 A1 A2 A3 | B7 | C4 C5 ]      query_start_loc = [0, 4, 5, 7]
    block_tables:       A -> [3, 9]   B -> [5, 1]   C -> [2]
    context_lens:       A: 4          B: 8          C: 6   (cached + new tokens)

    slot of token j of a sequence = block_table[j // block_size] * block_size + j % block_size

Nothing here owns memory: the cache tensors belong to `kv_cache.paged.PagedKVCache`, which
imports this module (never the other way round).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .reference import attention


@dataclass
class PagedAttentionMetadata:
    """Where this step's tokens go and what each sequence may look at.

    slot_mapping: (N,) int64 cache slot for each of the N new tokens
    query_start_loc: (S + 1,) int64 offsets of each sequence's tokens in the flattened batch
    context_lens: (S,) int64 tokens of each sequence in the cache after this step
    block_tables: (S, max_blocks_per_seq) int64 block ids (rows padded with 0)
    max_query_len: the most new tokens of one sequence, when the host knows it (the prefill
        kernel sizes its grid with it; None: computed from query_start_loc, a device sync)
    """

    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    max_query_len: int | None = None

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]


def write_kv_reference(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v: (N, H_kv, D) -> stored at `slot_mapping` in caches of (num_blocks, block_size, H_kv, D)."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = k
    v_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = v


def paged_attention_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedAttentionMetadata
) -> torch.Tensor:
    """q: (N, H, D) flattened queries -> (N, H, D), each sequence over its own cached tokens."""
    out = torch.empty_like(q)
    num_queries = meta.query_start_loc[1:] - meta.query_start_loc[:-1]  # (S,)
    # 1. Decode: one new token per sequence.  The common case once prompts are in, so all
    #    decoding sequences are gathered and attended in one batch.
    decoding = (num_queries == 1).nonzero().flatten()
    if len(decoding):
        rows = meta.query_start_loc[decoding]  # the token row of each decoding sequence
        out[rows] = _decode_attention(
            q[rows], k_cache, v_cache, meta.block_tables[decoding], meta.context_lens[decoding]
        )
    # 2. Prompts and prompt chunks: one sequence at a time.
    for i in (num_queries > 1).nonzero().flatten().tolist():
        start, end = meta.query_start_loc[i].item(), meta.query_start_loc[i + 1].item()
        out[start:end] = _chunk_attention(
            q[start:end], k_cache, v_cache, meta.block_tables[i], meta.context_lens[i].item()
        )
    return out


def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """(num_blocks, block_size, H_kv, D) cache, (S, W) block ids -> (S, W * block_size, H_kv, D)
    keys or values of each sequence in token order (positions past its length are junk)."""
    return cache[block_tables].flatten(1, 2)


def _decode_attention(q, k_cache, v_cache, block_tables, context_lens) -> torch.Tensor:
    """q: (S, H, D), one query per sequence, at the last position of its context -> (S, H, D)."""
    keys = _gather(k_cache, block_tables)  # (S, L, H_kv, D)
    values = _gather(v_cache, block_tables)
    valid = torch.arange(keys.shape[1], device=q.device)[None, :] < context_lens[:, None]  # (S, L)
    # Slots past a sequence's length hold whatever an earlier request left there: masked out
    # of the scores, and zeroed so that even a NaN left behind cannot leak through 0 * NaN.
    values = values.masked_fill(~valid[:, :, None, None], 0)
    out = attention(
        q[:, :, None, :],  # (S, H, 1, D)
        keys.transpose(1, 2),  # (S, H_kv, L, D)
        values.transpose(1, 2),
        valid[:, None, :],  # (S, 1, L)
    )
    return out[:, :, 0, :]


def _chunk_attention(q, k_cache, v_cache, block_table, context_len: int) -> torch.Tensor:
    """q: (T, H, D), the last T tokens of a sequence of `context_len` -> (T, H, D)."""
    keys = _gather(k_cache, block_table[None])[0, :context_len]  # (L, H_kv, D)
    values = _gather(v_cache, block_table[None])[0, :context_len]
    # The queries are the last T positions: causal within the chunk, full view of the cached
    # prefix before it.
    T = q.shape[0]
    query_pos = torch.arange(context_len - T, context_len, device=q.device)
    mask = torch.arange(context_len, device=q.device)[None, :] <= query_pos[:, None]  # (T, L)
    out = attention(
        q.transpose(0, 1)[None],  # (1, H, T, D)
        keys.transpose(0, 1)[None],  # (1, H_kv, L, D)
        values.transpose(0, 1)[None],
        mask[None],  # (1, T, L)
    )
    return out[0].transpose(0, 1)
