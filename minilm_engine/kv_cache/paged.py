"""The paged KV cache: keys and values in fixed-size blocks, and the model's view of them.

Contract: `PagedKVCache` owns the tensors, one (num_blocks, block_size, H_kv, D) pair per layer.
`PagedAttention(cache, metadata, backend)` is the model's `AttentionContext` for one engine step:
it writes this step's keys/values into the slots `metadata.slot_mapping` names, then each
sequence attends over its own blocks.  The attention itself (metadata, KV write, the torch
reference and the Triton kernels) lives in `attention/`; this module only hands it the tensors.
"""

from __future__ import annotations

import torch

from ..attention.backends import TORCH_BACKEND, AttentionBackend
from ..attention.paged import PagedAttentionMetadata
from ..models.config import ModelConfig


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


class PagedAttention:
    """`AttentionContext` for one engine step over a `PagedKVCache`.

    `backend` (from `attention.backends.get_attention_backend`) does the writing and the
    attending; None means the torch reference (`attention/paged.py`).
    """

    def __init__(
        self, cache: PagedKVCache, meta: PagedAttentionMetadata, backend: AttentionBackend | None = None
    ):
        self.cache = cache
        self.meta = meta
        backend = backend if backend is not None else TORCH_BACKEND
        self.write_kv = backend.write_kv
        self.paged_attention = backend.attend

    def attend(self, layer_idx: int, q, k, v) -> torch.Tensor:
        # The model gives (1, N, ., D): one flattened row holding every sequence's new tokens.
        k_cache, v_cache = self.cache.k[layer_idx], self.cache.v[layer_idx]
        self.write_kv(k_cache, v_cache, k[0], v[0], self.meta.slot_mapping)
        return self.paged_attention(q[0], k_cache, v_cache, self.meta)[None]
