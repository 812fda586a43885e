"""Device and dtype policy: fp32 on a CPU, bf16 on GPUs that support it, fp16 otherwise (T4).

Contract: `resolve_device(None)` picks CUDA when present, else the CPU; `resolve_dtype(spec,
device)` accepts "auto", a name ("float16", "fp16", "half", "bfloat16", "bf16", "float32",
"fp32", "float") or a `torch.dtype`, and raises `ValueError` for anything else or for a dtype the
device cannot run (bf16 on a GPU without bf16 support).
"""

from __future__ import annotations

import torch

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for, but torch sees no CUDA GPU here")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return device


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif dtype == "auto":
        if device.type == "cpu":
            return torch.float32  # CPUs run fp32 matmuls fastest and exactly
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    elif isinstance(dtype, str) and dtype.lower() in _DTYPES:
        resolved = _DTYPES[dtype.lower()]
    else:
        raise ValueError(
            f"dtype must be 'auto', one of {sorted(_DTYPES)} or a torch.dtype, got {dtype!r}"
        )
    if resolved not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype {resolved} is not supported; use float32, float16 or bfloat16")
    if resolved == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("this GPU has no bfloat16 support (e.g. a T4): use dtype='float16'")
    return resolved
