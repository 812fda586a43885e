"""Weight-only matmul kernels: who computes `x @ W.T` for a `QuantizedLinear`.

Contract: a kernel has a `name`, `prepare(layer)` (convert the layer's buffers to the layout it
reads, once, after loading; the reference and Triton kernels read the canonical layout) and
`linear(layer, x) -> (..., N)` which must equal `ReferenceKernel.linear` up to float rounding.
`select_kernel(requested, device, dtype)` resolves "auto" and says why a fast kernel cannot run:

    kernel       runs on                          what it does
    reference    any device                       dequantize to the model dtype, then F.linear
    cpu          CPU (torch with the ops)         the compiled micro-kernel (or torch's
                                                  operators) for few rows, else dequantize + BLAS
    triton       CUDA, compute capability >= 8.0  dequantizing matmul, dequant in the inner loop
                 (CPU under TRITON_INTERPRET=1)

"auto" takes "cpu" on a CPU and "triton" on CUDA where they can run, else the reference.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from minilm_engine.model.quantization.kernels.reference import ReferenceKernel

REFERENCE_KERNEL = ReferenceKernel()


def unavailable_reason(name: str, device: torch.device) -> str | None:
    """None when kernel `name` can run on `device`, else a sentence saying why not."""
    if name == "reference":
        return None
    if name == "cpu":
        from minilm_engine.model.quantization.kernels import cpu

        if device.type != "cpu":
            return f"the cpu kernel runs on a CPU, this model is on {device}"
        return cpu.unavailable_reason()
    if name == "triton":
        try:
            from minilm_engine.model.quantization.kernels import triton_weight_only
        except (ImportError, RuntimeError, OSError) as e:
            return f"Triton does not import ({e}); install it with `pip install triton`"
        return triton_weight_only.unavailable_reason(device)
    raise ValueError(f"unknown kernel {name!r}")


def select_kernel(requested: str, device: torch.device, dtype: torch.dtype):
    """The kernel object for `requested` ("auto", "reference", "cpu", "triton") on `device`; one
    that cannot run here warns with the reason and gives the reference (as attention does)."""
    if requested == "auto":
        candidate = "cpu" if device.type == "cpu" else "triton"
        if unavailable_reason(candidate, device) is None:
            return make_kernel(candidate)
        if device.type == "cuda":  # a T4: say why the GPU runs the slow path
            reason = unavailable_reason(candidate, device)
            warnings.warn(f"quantized matmul: Triton kernel unavailable ({reason}); using the reference", stacklevel=3)
        return REFERENCE_KERNEL
    reason = unavailable_reason(requested, device)
    if reason is not None:
        warnings.warn(f"quantization kernel {requested!r} cannot run: {reason}. Using the reference.", stacklevel=3)
        return REFERENCE_KERNEL
    return make_kernel(requested)


def make_kernel(name: str):
    if name == "reference":
        return REFERENCE_KERNEL
    if name == "cpu":
        from minilm_engine.model.quantization.kernels.cpu import CPUKernel

        return CPUKernel()
    from minilm_engine.model.quantization.kernels.triton_weight_only import TritonKernel

    return TritonKernel()


def prepare_kernels(model: nn.Module, requested: str = "auto") -> str:
    """Give every QuantizedLinear of `model` the selected kernel; returns its name."""
    from minilm_engine.model.quantization.linear import QuantizedLinear

    kernel = select_kernel(requested, model.device, model.dtype)
    for module in model.modules():
        if isinstance(module, QuantizedLinear) and module.kernel is not kernel:
            if module.kernel is not REFERENCE_KERNEL:
                raise RuntimeError(f"this layer already runs the {module.kernel.name!r} kernel, "
                                   "whose layout cannot be converted back; load the checkpoint "
                                   "again to switch kernels")
            kernel.prepare(module)
            module.kernel = kernel
    return kernel.name
