"""Engine settings, with vLLM's names, checked once at the boundary.

Contract: an `EngineConfig` that constructs is consistent (positive sizes, a token budget a
prompt can fit into when chunked prefill is off).  Every serving strategy reads the fields it
needs; the paged engine reads all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from minilm_engine.model.attention.backends import ATTENTION_BACKENDS
from minilm_engine.core.speculative_config import SpeculativeConfig
from minilm_engine.core.request_queue import SCHEDULING_POLICIES
from minilm_engine.core.structured_output import StructuredOutputsConfig


@dataclass
class EngineConfig:
    max_num_seqs: int = 16  # most requests in one batch
    max_num_batched_tokens: int = 512  # token budget of one engine step (prefill + decode)
    block_size: int = 16  # tokens per KV block
    # pool size; None = from kv_cache_memory, else room for max_num_seqs full-length requests
    # within the device's limit (1 GiB on a CPU, gpu_memory_utilization on a GPU)
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None  # byte budget for the pool, alternative to num_kv_blocks
    gpu_memory_utilization: float = 0.9  # on a GPU, share of memory the engine may fill
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    attention_backend: str = "auto"  # "torch" (reference), "cpu", "triton" (kernels); "auto": triton on CUDA, cpu on a CPU
    enforce_eager: bool = False  # True: never capture CUDA graphs (they are used on CUDA with triton)
    # Keep a StepRecord of every step in engine.trace (widgets read it; long runs turn it off).
    record_trace: bool = True
    # Speculative decoding (vLLM's spelling): {"model": DRAFT, "num_speculative_tokens": K}.
    speculative_config: SpeculativeConfig | dict | None = None
    scheduling_policy: str = "fcfs"  # or "priority": each request's, lower first (request_queue.py)
    max_logprobs: int = 20  # most top tokens a request may ask logprobs of per position (vLLM's)
    max_n: int = 128  # most samples (n) per prompt
    # Structured outputs (vLLM's --structured-outputs-config): {"disable_any_whitespace": true}.
    structured_outputs_config: StructuredOutputsConfig | dict | None = None

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("num_kv_blocks", "kv_cache_memory"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if self.num_kv_blocks is not None and self.kv_cache_memory is not None:
            raise ValueError("pass num_kv_blocks or kv_cache_memory, not both")
        if isinstance(self.max_logprobs, bool) or not isinstance(self.max_logprobs, int) or self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be an int >= 0, got {self.max_logprobs!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], "
                             f"got {self.gpu_memory_utilization}")
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "enforce_eager", "record_trace"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        self.structured_outputs_config = StructuredOutputsConfig.parse(self.structured_outputs_config)
        for name, allowed in (("scheduling_policy", SCHEDULING_POLICIES),
                              ("attention_backend", ATTENTION_BACKENDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
