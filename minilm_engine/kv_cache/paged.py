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
    """K and V for `num_blocks` blocks of `block_size` tokens, per layer, plus one scratch block.

    Blocks 0 .. num_blocks - 1 are the pool's (`BlockPool` hands them out).  Block
    `scratch_block` (= num_blocks) belongs to nobody: the padding rows of a captured CUDA graph
    write their keys and values there (`engine/cuda_graphs.py`), so padding never touches a
    request's blocks.
    """

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        shape = (num_blocks + 1, block_size, config.num_key_value_heads, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_block = num_blocks

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return block_size * config.kv_bytes_per_token(element)

    @property
    def num_bytes(self) -> int:
        """Bytes of the pool's blocks (the scratch block is not counted: nothing is stored there)."""
        per_block = self.k[0][0].numel() * self.k[0].element_size()
        return 2 * len(self.k) * self.num_blocks * per_block


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
