"""Attention backends: who writes the paged KV cache and who attends over it.

Contract: `get_attention_backend(name, device, dtype)` returns an `AttentionBackend` whose two
functions have the signatures of the torch reference in `paged.py`:

    write_kv(k_cache, v_cache, k, v, slot_mapping)   k, v: (N, H_kv, D) into the slots named
    attend(q, k_cache, v_cache, meta) -> (N, H, D)   each sequence over its own cached tokens

    "torch"   the reference: readable, runs anywhere, the definition the others are tested against
    "triton"  the kernels of triton_*.py: on a CUDA GPU, or on the CPU under the Triton
              interpreter (TRITON_INTERPRET=1 set before they are imported; slow, for tests)
    "auto"    "triton" on a CUDA GPU when Triton imports, "torch" otherwise (the CPU default)

Asking for "triton" where it cannot run is not an error: the engine warns, says why, and runs
the torch reference instead.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from .paged import PagedAttentionMetadata, paged_attention_reference, write_kv_reference

ATTENTION_BACKENDS = ("auto", "torch", "triton")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class AttentionBackend:
    name: str  # "torch" or "triton": what actually runs, once "auto" is resolved
    write_kv: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PagedAttentionMetadata], torch.Tensor]


TORCH_BACKEND = AttentionBackend("torch", write_kv_reference, paged_attention_reference)


def triton_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when the Triton kernels can run on `device` in `dtype`, else why not."""
    if dtype not in SUPPORTED_DTYPES:
        return f"the Triton kernels support {SUPPORTED_DTYPES}, not {dtype}"
    try:
        from . import triton_paged_prefill
    except (ImportError, RuntimeError, OSError) as e:  # not installed, or broken on this platform
        return f"Triton does not import ({e}); install it with `pip install triton`"
    if device.type == "cuda":
        if triton_paged_prefill.is_interpreted():
            return "the Triton kernels were imported under TRITON_INTERPRET=1, which runs on the CPU only"
        capability = torch.cuda.get_device_capability(device)
        if capability < (7, 5):
            return "Triton needs a GPU of compute capability 7.5 or newer"
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


def make_triton_backend(num_sms: int = 0) -> AttentionBackend:
    """The Triton kernels; `num_sms` (the GPU's multiprocessor count, 0: never) decides when a
    decode step splits each context over several programs (`triton_paged_decode_split.py`)."""
    from .triton_paged_decode import paged_decode_attention
    from .triton_paged_decode_split import paged_decode_split_attention, should_split
    from .triton_paged_prefill import paged_prefill_attention
    from .triton_write_kv import write_kv

    def attend(q, k_cache, v_cache, meta: PagedAttentionMetadata) -> torch.Tensor:
        # Every scheduled sequence has at least one new token, so N == S means one query each:
        # a pure decode step, the common case once prompts are in.  Anything else (prompts,
        # chunks, or decodes mixed with them) goes to the prefill kernel, which handles all.
        if q.shape[0] == meta.num_seqs:
            # Few sequences leave most of the GPU idle in the plain kernel: split their contexts.
            max_context = meta.block_tables.shape[1] * k_cache.shape[1]  # a bound, no sync
            if should_split(meta.num_seqs, k_cache.shape[2], max_context, num_sms):
                return paged_decode_split_attention(q, k_cache, v_cache, meta)
            return paged_decode_attention(q, k_cache, v_cache, meta)
        return paged_prefill_attention(q, k_cache, v_cache, meta)

    return AttentionBackend("triton", write_kv, attend)


def get_attention_backend(
    name: str, device: torch.device | str, dtype: torch.dtype = torch.float32
) -> AttentionBackend:
    """Resolve "auto" | "torch" | "triton" for a model on `device` in `dtype` (see module doc)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {name!r}")
    device = torch.device(device)
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TORCH_BACKEND
    reason = triton_unavailable_reason(device, dtype)
    if reason is None:
        # On the CPU (the interpreter, for tests) the split decode kernel is tested on its own.
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0
        return make_triton_backend(num_sms)
    if name == "triton":
        warnings.warn(f"attention_backend='triton' cannot run: {reason}. Using the torch reference.", stacklevel=2)
    return TORCH_BACKEND
