"""The paged KV cache: keys and values in fixed-size blocks, attention through block tables.

Contract: `PagedKVCache` owns the tensors, one (num_blocks, block_size, H_kv, D) pair per layer.
`PagedAttention(cache, metadata)` is the model's `AttentionContext` for one engine step: it
writes this step's keys/values into the slots `metadata.slot_mapping` names, then each sequence
attends over its own blocks.  All sequences of a step are flattened into one row of tokens
(no padding), prefill chunks and single decode tokens side by side:

    flattened queries:  [ A0 A1 A2 A3 | B7 | C4 C5 ]      query_start_loc = [0, 4, 5, 7]
    block_tables:       A -> [3, 9]   B -> [5, 1]   C -> [2]
    context_lens:       A: 4          B: 8          C: 6   (cached + new tokens)

    slot of token j of a sequence = block_table[j // block_size] * block_size + j % block_size

`paged_attention_reference` is the readable definition; faster backends are tested against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..attention import attention
from ..models.config import ModelConfig

if TYPE_CHECKING:  # backends.py imports this module, so only type checkers import it back
    from ..attention.backends import AttentionBackend


class PagedKVCache:
    """K and V for `num_blocks` blocks of `block_size` tokens, per layer."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.num_blocks = num_blocks
        self.block_size = block_size

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return block_size * config.kv_bytes_per_token(element)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


@dataclass
class PagedAttentionMetadata:
    """Where this step's tokens go and what each sequence may look at.

    slot_mapping: (N,) int64 cache slot for each of the N new tokens
    query_start_loc: (S + 1,) int64 offsets of each sequence's tokens in the flattened batch
    context_lens: (S,) int64 tokens of each sequence in the cache after this step
    block_tables: (S, max_blocks_per_seq) int64 block ids (rows padded with 0)
    """

    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor

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
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    starts = meta.query_start_loc.tolist()
    for i, context_len in enumerate(meta.context_lens.tolist()):
        q_start, q_end = starts[i], starts[i + 1]
        num_queries = q_end - q_start
        # 1. Gather this sequence's keys and values from its blocks, in token order.
        num_blocks = -(-context_len // block_size)
        blocks = meta.block_tables[i, :num_blocks]
        keys = k_cache[blocks].flatten(0, 1)[:context_len]  # (L, H_kv, D)
        values = v_cache[blocks].flatten(0, 1)[:context_len]
        # 2. The queries are the last `num_queries` tokens: causal within the chunk, full
        #    view of the cached prefix before it.
        query_pos = torch.arange(context_len - num_queries, context_len, device=q.device)
        mask = torch.arange(context_len, device=q.device)[None, :] <= query_pos[:, None]
        seq_out = attention(
            q[q_start:q_end].transpose(0, 1)[None],  # (1, H, T, D)
            keys.transpose(0, 1)[None],  # (1, H_kv, L, D)
            values.transpose(0, 1)[None],
            mask[None],  # (1, T, L)
        )
        out[q_start:q_end] = seq_out[0].transpose(0, 1)
    return out


class PagedAttention:
    """`AttentionContext` for one engine step over a `PagedKVCache`.

    `backend` (from `attention.backends.get_attention_backend`) does the writing and the
    attending; None means the torch reference functions above.
    """

    def __init__(
        self, cache: PagedKVCache, meta: PagedAttentionMetadata, backend: AttentionBackend | None = None
    ):
        self.cache = cache
        self.meta = meta
        self.write_kv = backend.write_kv if backend is not None else write_kv_reference
        self.paged_attention = backend.attend if backend is not None else paged_attention_reference

    def attend(self, layer_idx: int, q, k, v) -> torch.Tensor:
        # The model gives (1, N, ., D): one flattened row holding every sequence's new tokens.
        k_cache, v_cache = self.cache.k[layer_idx], self.cache.v[layer_idx]
        self.write_kv(k_cache, v_cache, k[0], v[0], self.meta.slot_mapping)
        return self.paged_attention(q[0], k_cache, v_cache, self.meta)[None]
