"""Device and dtype policy: fp32 on a CPU, bf16 on GPUs that support it, fp16 otherwise (T4).

Contract: `resolve_device(None)` picks $MINILM_DEVICE if set, else CUDA when present, else the CPU; `resolve_dtype(spec,
device)` accepts "auto", a name ("float16", "fp16", "half", "bfloat16", "bf16", "float32",
"fp32", "float") or a `torch.dtype`, and raises `ValueError` for anything else.  Asking for
bfloat16 on a GPU without native bfloat16 (a T4) is not an error: it warns and uses float16.
The policy itself is `choose_dtype`, a pure function of the device's compute capability.

What the CPU can do: `native_bf16_matmul()` (whether this CPU runs bf16 matmuls natively,
through oneDNN; without it torch emulates them, many times slower than fp32) and `cpuinfo_field`
(a line of /proc/cpuinfo).  Naming the machine a number was measured on is the course's
(`course/machine.py`).
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

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
    """The dtype policy as a pure function: (dtype to use, a warning or None).

    `capability` is the GPU's compute capability (None on a CPU).  bfloat16 runs natively from
    capability 8.0 (A100, H100, RTX 30xx and later).  A T4 (7.5) or V100 (7.0) can only emulate
    it, slowly, and Triton cannot compile it there: "auto" takes float16 on them, and an explicit
    bfloat16 falls back to float16 with a warning.
    """
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


SMALL_MODEL_PARAMETERS = 50_000_000


def cpu_threads_for(num_parameters: int) -> int | None:
    """Torch threads for a model on a CPU: 1 for a small model, None (torch's default) otherwise.

    A small model's matmuls are too small to split across threads, and on a busy machine the
    spinning worker threads made each decode step of the shipped 7M-parameter model 10-30x
    slower (measured on the 2-core CI machine).  A model of a few hundred million parameters
    has matmuls worth splitting.
    """
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
    """Whether this CPU runs bf16 matmuls natively (oneDNN with AVX512_BF16 / AMX, or ARM's bf16
    instructions).  Without it torch emulates bf16, and a bf16 matmul is many times slower than
    the same one in fp32 (on a 2-core AVX2 CPU, 16 rows times a 3072 x 1024 layer 25x slower).
    Callers choose fp32 or a fallback path from it: the quantized kernels' many-row path, the
    fused CPU backend, the tests that expect one or the other."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
