"""The paged KV cache: keys and values in fixed-size blocks.

Contract: `PagedKVCache` owns the tensors, one (num_blocks + 1, block_size, H_kv, D) pair per
layer; the attention that reads them is `context.PagedAttention`.
"""

from __future__ import annotations

import torch

from minilm_engine.model.config import ModelConfig

class PagedKVCache:
    """K and V for `num_blocks` blocks of `block_size` tokens, per layer, plus one scratch block.
    Blocks 0 .. num_blocks - 1 are the pool's; `scratch_block` (= num_blocks) is nobody's: CUDA
    graphs' padding rows write there (`worker/cuda_graphs.py`)."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str):
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
