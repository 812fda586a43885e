"""How many KV-cache blocks an engine reserves.

Contract: `decide_num_kv_blocks(config, model_config, dtype, device, max_model_len)` returns the
pool size: what the engine config asks for (`num_kv_blocks`, or a `kv_cache_memory` byte
budget), else room for `max_num_seqs` requests of `max_model_len` tokens within what the device
allows (`kv_cache_limit`: 1 GiB on a CPU; on a GPU, what `gpu_memory_utilization` leaves).
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..models.config import ModelConfig
from .block_table import cdiv
from .paged import PagedKVCache

CPU_KV_CACHE_LIMIT = 1 << 30  # never reserve more than 1 GiB of KV cache on a CPU by default


class KVCacheSizing(Protocol):
    """The fields of `engine.config.EngineConfig` that size the pool (named here, not imported,
    so that kv_cache/ does not depend on the engine that uses it)."""

    max_num_seqs: int
    block_size: int
    num_kv_blocks: int | None
    kv_cache_memory: int | None
    gpu_memory_utilization: float


def decide_num_kv_blocks(
    config: KVCacheSizing,
    model_config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
    draft_model_config: ModelConfig | None = None,
) -> int:
    """Pool size: as asked (`num_kv_blocks`, or `kv_cache_memory` bytes), else the default below.

    With a draft model (speculative decoding) the draft gets a pool of as many blocks (it holds
    the same tokens), so one block costs the target's bytes plus the draft's.
    """
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = PagedKVCache.bytes_per_block(model_config, config.block_size, dtype)
    if draft_model_config is not None:
        per_block += PagedKVCache.bytes_per_block(draft_model_config, config.block_size, dtype)
    if config.kv_cache_memory is not None:
        return max(1, config.kv_cache_memory // per_block)
    return default_num_kv_blocks(config, max_model_len, per_block, kv_cache_limit(config, device))


def kv_cache_limit(config: KVCacheSizing, device: torch.device) -> int:
    """Most bytes a default pool may take: 1 GiB on a CPU; on a GPU, what is free (after the
    weights) minus the share of the whole card that `gpu_memory_utilization` leaves alone."""
    if device.type != "cuda":
        return CPU_KV_CACHE_LIMIT
    free, total = torch.cuda.mem_get_info(device)
    return int(free - (1 - config.gpu_memory_utilization) * total)


def default_num_kv_blocks(config: KVCacheSizing, max_model_len: int, per_block: int, limit: int) -> int:
    """Room for `max_num_seqs` requests of `max_model_len` tokens, within `limit` bytes.

    Not all the memory there is (vLLM's choice): more blocks than that could only hold prefix
    cache, and several engines can then share one GPU, as the chapters' side-by-side
    comparisons do.
    """
    if limit < per_block:
        raise RuntimeError(
            f"no memory left for a KV cache: {limit / 2**20:.0f} MiB allowed, one block needs "
            f"{per_block / 2**10:.0f} KiB; free other engines, raise gpu_memory_utilization, "
            f"or pass num_kv_blocks / kv_cache_memory"
        )
    wanted = config.max_num_seqs * cdiv(max_model_len, config.block_size)  # whole blocks each
    return max(1, min(wanted, limit // per_block))
