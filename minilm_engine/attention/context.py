"""The model's attention context for one engine step over a paged KV cache.

Contract: `PagedAttention(cache, metadata, backend)` is an `AttentionContext`: for each layer it
writes this step's keys/values into the slots `metadata.slot_mapping` names, then each sequence
attends over its own blocks, both through `backend` (`backends.py`: the torch reference or the
Triton kernels).  `cache` is anything with per-layer lists `k` and `v` of (num_blocks,
block_size, H_kv, D) tensors (`kv_cache.paged.PagedKVCache`, or the draft's cache): attention
reads the tensors and owns none, so it imports nothing from `kv_cache/`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .backends import TORCH_BACKEND, AttentionBackend
from .paged import PagedAttentionMetadata


class PagedTensors(Protocol):
    k: list[torch.Tensor]  # per layer: (num_blocks, block_size, H_kv, D)
    v: list[torch.Tensor]


class PagedAttention:
    """`AttentionContext` for one engine step over a paged cache.

    `backend` (from `attention.backends.get_attention_backend`) does the writing and the
    attending; None means the torch reference (`attention/paged.py`).
    """

    def __init__(
        self, cache: PagedTensors, meta: PagedAttentionMetadata, backend: AttentionBackend | None = None
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
