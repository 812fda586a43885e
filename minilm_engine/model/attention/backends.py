"""Attention backends: who plans a step, writes the paged KV cache and attends over it.

Contract: `get_attention_backend(name, device, dtype)` returns an `AttentionBackend`, whose
methods the attention context (`context.PagedAttention`) calls in this order:

    plan = backend.plan(meta, block_size, num_kv_heads)    once per step, before the first layer
    for each layer:
        backend.write_kv(k_cache, v_cache, k, v, meta.slot_mapping)   k, v: (N, H_kv, D)
        out = backend.attend(q, k_cache, v_cache, plan)               q: (N, H, D) -> (N, H, D)

The plan is what a backend works out once per step from the metadata: the torch reference's
gather indices (from the host copies), the Triton backend's choice of kernel (from shapes only,
so a CUDA graph can record it).  `attend` also takes metadata instead, and plans on the spot.

    "torch"   the reference (`paged.py`): readable, runs anywhere; the others are tested against it
    "cpu"     `cpu.py`: SDPA for prompts and chunks, a compiled decode kernel reading keys in place
    "triton"  the triton_*.py kernels: on a CUDA GPU, or under TRITON_INTERPRET=1 on a CPU (tests)
    "auto"    "triton" on a CUDA GPU when Triton imports, "cpu" on a CPU, "torch" otherwise

Asking for "triton" where it cannot run warns, says why, and runs the torch reference.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

import torch

from minilm_engine import pluggable
from minilm_engine.model.attention.paged import (
    PagedAttentionMetadata,
    ReferencePlan,
    paged_attention_reference,
    plan_reference_attention,
    write_kv_reference,
)

ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class AttentionBackend(ABC):
    """Plan once per step, then write K/V and attend once per layer (see the module doc)."""

    name: str  # "torch", "cpu" or "triton": what actually runs, once "auto" is resolved

    @abstractmethod
    def plan(self, meta: PagedAttentionMetadata, block_size: int, num_kv_heads: int):
        """The step's plan, for caches of (num_blocks, block_size, num_kv_heads, D)."""

    def write_kv(self, k_cache, v_cache, k, v, slot_mapping: torch.Tensor) -> None:
        """k, v: (N, H_kv, D) -> stored at `slot_mapping` (N,) in this layer's caches."""
        write_kv_reference(k_cache, v_cache, k, v, slot_mapping)

    @abstractmethod
    def _attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan) -> torch.Tensor:
        """q: (N, H, D) -> (N, H, D), each sequence over its own cached tokens, as `plan` says."""

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan) -> torch.Tensor:
        """q: (N, H, D) -> (N, H, D).  `plan` from `self.plan`, or metadata to plan now."""
        if isinstance(plan, PagedAttentionMetadata):
            plan = self.plan(plan, k_cache.shape[1], k_cache.shape[2])
        return self._attend(q, k_cache, v_cache, plan)


class TorchBackend(AttentionBackend):
    """The readable reference of `paged.py`; its plan is the gather indices of the step."""

    name = "torch"

    def plan(self, meta: PagedAttentionMetadata, block_size: int, num_kv_heads: int) -> ReferencePlan:
        return plan_reference_attention(meta, block_size, num_kv_heads)

    def _attend(self, q, k_cache, v_cache, plan: ReferencePlan) -> torch.Tensor:
        return paged_attention_reference(q, k_cache, v_cache, plan.meta, plan)


TORCH_BACKEND = TorchBackend()


def triton_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when the Triton kernels can run on `device` in `dtype`, else why not."""
    if dtype not in SUPPORTED_DTYPES:
        return f"the Triton kernels support {SUPPORTED_DTYPES}, not {dtype}"
    try:
        from minilm_engine.model.attention import triton_paged_prefill
    except (ImportError, RuntimeError, OSError) as e:  # not installed, or broken on this platform
        return f"Triton does not import ({e}); install it with `pip install triton`"
    if device.type == "cuda":
        if triton_paged_prefill.is_interpreted():
            return "the Triton kernels were imported under TRITON_INTERPRET=1, which runs on the CPU only"
        capability = torch.cuda.get_device_capability(device)
        if capability < (7, 5):
            return "Triton needs a GPU of compute capability 7.5 or newer"
        version = _triton_version()
        if capability < (8, 0) and version[:2] >= (3, 3):  # Triton 3.3+ dropped sm75 (triton#10918)
            return (f"Triton {version[2]} does not support compute capability "
                    f"{capability[0]}.{capability[1]} (e.g. a T4); it needs 8.0 or newer")
        if dtype == torch.bfloat16 and capability < (8, 0):
            return "Triton compiles bfloat16 only for compute capability 8.0 or newer (use float16)"
        return None
    if device.type == "cpu" and triton_paged_prefill.is_interpreted():
        return None
    return (
        f"the Triton kernels run on a CUDA GPU, or on the CPU only under the Triton interpreter "
        f"(set TRITON_INTERPRET=1 before importing minilm_engine; slow, meant for tests); "
        f"this model is on {device}"
    )


def _triton_version() -> tuple[int, int, str]:
    """(major, minor, the version text) of the installed Triton."""
    import triton

    major, minor = triton.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0), triton.__version__


@dataclass(frozen=True)
class TritonPlan:
    """Which kernel attends this step, decided from shapes on the host (no device sync)."""

    meta: PagedAttentionMetadata
    kernel: Literal["decode", "split", "prefill"]


class TritonBackend(AttentionBackend):
    """The Triton kernels; `num_sms` (the GPU's multiprocessor count, 0: never) decides when a
    decode step splits each context over several programs (`triton_paged_decode_split.py`)."""

    name = "triton"

    def __init__(self, num_sms: int = 0):
        from minilm_engine.model.attention.triton_paged_decode import paged_decode_attention
        from minilm_engine.model.attention.triton_paged_decode_split import (
            paged_decode_split_attention,
            should_split,
        )
        from minilm_engine.model.attention.triton_paged_prefill import paged_prefill_attention
        from minilm_engine.model.attention.triton_write_kv import write_kv

        self.num_sms = num_sms
        self._should_split = should_split
        self._write_kv = write_kv
        self._kernels = {
            "decode": paged_decode_attention,
            "split": paged_decode_split_attention,
            "prefill": paged_prefill_attention,
        }

    def plan(self, meta: PagedAttentionMetadata, block_size: int, num_kv_heads: int) -> TritonPlan:
        # N == S: one query each, a pure decode step.  Anything else goes to the prefill kernel.
        if meta.num_tokens != meta.num_seqs:
            return TritonPlan(meta, "prefill")
        # Few sequences leave most of the GPU idle in the plain kernel: split their contexts.
        # A decode kernel put in through `pluggable` (chapter A1's exercise) always runs: the
        # split kernel is the package's own and would step around it.
        max_context = meta.block_tables.shape[1] * block_size  # a bound, no sync
        split = (not pluggable.is_overridden("attention.decode_kernel")
                 and self._should_split(meta.num_seqs, num_kv_heads, max_context, self.num_sms))
        return TritonPlan(meta, "split" if split else "decode")

    def write_kv(self, k_cache, v_cache, k, v, slot_mapping) -> None:
        self._write_kv(k_cache, v_cache, k, v, slot_mapping)  # the Triton kernel

    def _attend(self, q, k_cache, v_cache, plan: TritonPlan) -> torch.Tensor:
        return self._kernels[plan.kernel](q, k_cache, v_cache, plan.meta)


def get_attention_backend(
    name: str, device: torch.device | str, dtype: torch.dtype = torch.float32
) -> AttentionBackend:
    """Resolve "auto" | "torch" | "cpu" | "triton" for a model on `device` in `dtype` (see module doc)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {name!r}")
    device = torch.device(device)
    if name == "torch":
        return TORCH_BACKEND
    if name == "cpu" or (name == "auto" and device.type == "cpu"):
        if device.type != "cpu":
            warnings.warn(f"attention_backend='cpu' runs on the CPU and the model is on {device}. "
                          "Using the torch reference.", stacklevel=2)
            return TORCH_BACKEND
        from minilm_engine.model.attention.cpu import make_cpu_backend  # imports this module

        return make_cpu_backend()
    if name == "auto" and device.type != "cuda":
        return TORCH_BACKEND
    reason = triton_unavailable_reason(device, dtype)
    if reason is None:
        # On the CPU (the interpreter, for tests) the split decode kernel is tested on its own.
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0
        return TritonBackend(num_sms)
    if name == "triton":
        warnings.warn(f"attention_backend='triton' cannot run: {reason}. Using the torch reference.", stacklevel=2)
    return TORCH_BACKEND
