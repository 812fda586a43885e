"""How many KV-cache blocks an engine reserves.

Contract: `decide_num_kv_blocks(config, model_config, dtype, device, max_model_len)` returns the
pool size: what the engine config asks for (`num_kv_blocks`, or `kv_cache_memory` bytes), else
room for `max_num_seqs` requests of `max_model_len` tokens within what the device allows (1 GiB
on a CPU; on a GPU, what `gpu_memory_utilization` leaves).  `KVCacheBudget` is the pool's
arithmetic, and `max_context_len(concurrency)` the longest context each of `concurrency`
requests can have at once:

    bytes/token/layer = 2 (K and V) x kv heads x head_dim x bytes per element
    bytes/token       = layers x bytes/token/layer  (+ the draft model's, when speculating)
    tokens in pool    = num_blocks x block_size
    context at C      = min(max_position_embeddings, (num_blocks // C) x block_size)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minilm_engine.core.config import EngineConfig
from minilm_engine.core.kv_cache_utils import cdiv
from minilm_engine.model.config import ModelConfig

CPU_KV_CACHE_LIMIT = 1 << 30  # never reserve more than 1 GiB of KV cache on a CPU by default


def decide_num_kv_blocks(
    config: EngineConfig,
    model_config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
    draft_model_config: ModelConfig | None = None,
) -> int:
    """Pool size: as asked (`num_kv_blocks`, or `kv_cache_memory` bytes), else the default below.
    A draft model (speculative decoding) gets as many blocks: one block costs both models' bytes.
    On a GPU the limit is what is free (after the weights) minus the share of the whole card
    that `gpu_memory_utilization` leaves alone."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    budget = KVCacheBudget.of(model_config, dtype, config.block_size, 1, draft_model_config)
    per_block = budget.bytes_per_block
    if config.kv_cache_memory is not None:
        return max(1, config.kv_cache_memory // per_block)
    limit = CPU_KV_CACHE_LIMIT
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        limit = int(free - (1 - config.gpu_memory_utilization) * total)
    return default_num_kv_blocks(config, max_model_len, per_block, limit)


def default_num_kv_blocks(config: EngineConfig, max_model_len: int, per_block: int,
                          limit: int) -> int:
    """Room for `max_num_seqs` requests of `max_model_len` tokens, within `limit` bytes: not all
    the memory there is (more blocks could only hold prefix cache), so engines can share a GPU."""
    if limit < per_block:
        raise RuntimeError(
            f"no memory left for a KV cache: {limit / 2**20:.0f} MiB allowed, one block needs "
            f"{per_block / 2**10:.0f} KiB; free other engines, raise gpu_memory_utilization, "
            f"or pass num_kv_blocks / kv_cache_memory"
        )
    wanted = config.max_num_seqs * cdiv(max_model_len, config.block_size)  # whole blocks each
    return max(1, min(wanted, limit // per_block))


def max_context_len(num_blocks: int, block_size: int, concurrency: int, max_position_embeddings: int) -> int:
    """The longest context each of `concurrency` requests can hold at once: the pool's blocks
    shared evenly, whole blocks each, never more than the architecture's positions."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    return min(max_position_embeddings, (num_blocks // concurrency) * block_size)


@dataclass(frozen=True)
class KVCacheBudget:
    """What the KV pool holds, from the model's shape and the pool's size (see the module doc)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    bytes_per_element: int
    block_size: int
    num_blocks: int
    max_position_embeddings: int
    draft_bytes_per_token: int = 0  # speculative decoding: the draft's KV for the same tokens

    @classmethod
    def of(cls, model_config: ModelConfig, dtype: torch.dtype, block_size: int, num_blocks: int,
           draft_model_config: ModelConfig | None = None) -> KVCacheBudget:
        element = torch.empty((), dtype=dtype).element_size()
        draft = 0 if draft_model_config is None else draft_model_config.kv_bytes_per_token(element)
        return cls(model_config.num_hidden_layers, model_config.num_key_value_heads, model_config.head_dim,
                   element, block_size, num_blocks, model_config.max_position_embeddings, draft)

    @property
    def bytes_per_token_per_layer(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * self.bytes_per_element

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * self.bytes_per_token_per_layer + self.draft_bytes_per_token

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.bytes_per_token

    @property
    def num_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def max_context_len(self, concurrency: int = 1) -> int:
        return max_context_len(self.num_blocks, self.block_size, concurrency, self.max_position_embeddings)

    def describe(self, concurrencies: tuple[int, ...] = (1,)) -> str:
        """The arithmetic, as `serve` prints it at startup."""
        lines = [
            f"KV cache: 2 (K, V) x {self.num_kv_heads} kv heads x {self.head_dim} head_dim x "
            f"{self.bytes_per_element} B = {self.bytes_per_token_per_layer:,} B per token per layer; "
            f"x {self.num_layers} layers"
            + (f" + {self.draft_bytes_per_token:,} B (draft)" if self.draft_bytes_per_token else "")
            + f" = {self.bytes_per_token:,} B per token",
            f"  {self.num_blocks:,} blocks x {self.block_size} tokens = {self.num_tokens:,} tokens "
            f"({self.num_bytes / 2**20:,.1f} MiB); the architecture allows {self.max_position_embeddings:,}",
        ]
        for c in concurrencies:
            # Only the first line is a cap: a paged engine gives one request all the blocks it
            # needs, so more concurrency means fewer long requests at once, not shorter ones.
            who, note = ("one request alone", "the cap on any request") if c == 1 else (
                f"each of {c} requests at once", "longer ones still run, fewer at a time")
            lines.append(f"  largest context, {who}: min({self.max_position_embeddings:,}, "
                         f"({self.num_blocks:,} // {c}) x {self.block_size}) = {self.max_context_len(c):,} tokens"
                         f" ({note})")
        return "\n".join(lines)
