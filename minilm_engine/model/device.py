"""Device and dtype policy: fp32 on a CPU, bf16 on GPUs that support it, fp16 otherwise (T4).

Contract: `resolve_device(None)` picks $MINILM_DEVICE if set, else CUDA when present, else the
CPU; `resolve_dtype(spec, device)` accepts "auto", a dtype name or alias, or a `torch.dtype`,
and raises `ValueError` for anything else; bfloat16 asked for on a GPU without it (a T4) warns
and uses float16.  The policy is `choose_dtype`, a pure function of the compute capability.
`native_bf16_matmul()` and `cpuinfo_field` say what the CPU can do; `upload` sends a step's
small host data to the device without making the host wait; `device_context(device)` makes a
GPU the current one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from pathlib import Path

import torch

_DTYPES = {
    **dict.fromkeys(("float32", "fp32", "float"), torch.float32),
    **dict.fromkeys(("float16", "fp16", "half"), torch.float16),
    **dict.fromkeys(("bfloat16", "bf16"), torch.bfloat16),
}


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """None: $MINILM_DEVICE if set (the test suite sets "cpu"), else CUDA when present, else the CPU."""
    if device is None:
        device = os.environ.get("MINILM_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for, but torch sees no CUDA GPU here")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return device


def choose_dtype(dtype: str | torch.dtype, device_type: str, capability: tuple[int, int] | None) -> tuple[torch.dtype, str | None]:
    """The dtype policy: (dtype to use, a warning or None).  `capability`: the GPU's compute
    capability (None on a CPU).  bfloat16 is native from 8.0; below (T4, V100) "auto" takes
    float16, and an explicit bfloat16 falls back to float16 with a warning."""
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif dtype == "auto":
        if device_type == "cpu":
            return torch.float32, None  # CPUs run fp32 matmuls fastest and exactly
        return (torch.bfloat16 if capability >= (8, 0) else torch.float16), None
    elif isinstance(dtype, str) and dtype.lower() in _DTYPES:
        resolved = _DTYPES[dtype.lower()]
    else:
        raise ValueError(
            f"dtype must be 'auto', one of {sorted(_DTYPES)} or a torch.dtype, got {dtype!r}"
        )
    if resolved not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype {resolved} is not supported; use float32, float16 or bfloat16")
    if resolved == torch.bfloat16 and device_type == "cuda" and capability < (8, 0):
        major, minor = capability
        return torch.float16, (
            f"this GPU (compute capability {major}.{minor}, e.g. a T4) has no native bfloat16; "
            f"using float16 instead (pass dtype='float16' or 'auto' to silence this)"
        )
    return resolved, None


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    resolved, warning = choose_dtype(dtype, device.type, capability)
    if warning is not None:
        warnings.warn(warning, stacklevel=3)
    return resolved


def upload(values, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A small host list or array -> a tensor on `device`, through pinned memory on a GPU, so the
    host does not wait for the GPU (a copy from pageable memory would); on a CPU, no copy."""
    tensor = torch.as_tensor(values, dtype=dtype)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def device_context(device: torch.device):
    """A context in which `device` is the current CUDA device (Triton launches and graph replays
    go to the current device, not to their tensors'); on a CPU, nothing."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


SMALL_MODEL_PARAMETERS = 50_000_000


def cpu_threads_for(num_parameters: int) -> int | None:
    """Torch threads for a model on a CPU: 1 for a small model (its matmuls are too small to
    split, and spinning threads made the shipped model's steps 10-30x slower on a busy 2-core
    machine), None (torch's default) otherwise."""
    return 1 if num_parameters < SMALL_MODEL_PARAMETERS else None


def cpuinfo_field(*keys: str) -> str | None:
    """The first /proc/cpuinfo line starting with one of `keys` (Linux), else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(keys):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@functools.cache
def native_bf16_matmul() -> bool:
    """Whether this CPU runs bf16 matmuls natively (oneDNN with AVX512_BF16 / AMX, or ARM's
    bf16); without, torch emulates them, many times slower than fp32."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
