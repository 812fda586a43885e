"""The model's attention context for one engine step over a paged KV cache.

Contract: `PagedAttention(cache, metadata, backend)` is an `AttentionContext` for one step: built
before the forward pass, it asks `backend` (`backends.py`) for the step's plan, once; for each
layer the model calls `attend`, which writes the layer's new keys/values into the slots
`metadata.slot_mapping` names and attends each sequence over its own blocks, with that plan.
`cache` is anything with per-layer lists `k` and `v` of (num_blocks, block_size, H_kv, D)
tensors (`kv_cache.PagedKVCache`, or the draft's cache).
"""

from __future__ import annotations

from typing import Protocol

import torch

from minilm_engine.model.attention.backends import TORCH_BACKEND, AttentionBackend
from minilm_engine.model.attention.paged import PagedAttentionMetadata


class PagedTensors(Protocol):
    k: list[torch.Tensor]  # per layer: (num_blocks, block_size, H_kv, D)
    v: list[torch.Tensor]


class PagedAttention:
    """`backend`: None means the torch reference.  All layers share one cache geometry, so one
    plan serves every layer."""

    def __init__(
        self, cache: PagedTensors, meta: PagedAttentionMetadata, backend: AttentionBackend | None = None
    ):
        self.cache = cache
        self.meta = meta
        self.backend = backend if backend is not None else TORCH_BACKEND
        _, block_size, num_kv_heads, _ = cache.k[0].shape
        self.plan = self.backend.plan(meta, block_size, num_kv_heads)

    def attend(self, layer_idx: int, q, k, v) -> torch.Tensor:
        """q: (N, H, D), k, v: (N, H_kv, D), every sequence's new tokens -> (N, H, D)."""
        k_cache, v_cache = self.cache.k[layer_idx], self.cache.v[layer_idx]
        self.backend.write_kv(k_cache, v_cache, k, v, self.meta.slot_mapping)
        return self.backend.attend(q, k_cache, v_cache, self.plan)
