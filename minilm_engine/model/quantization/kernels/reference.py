"""The readable reference: dequantize the whole weight to the model dtype, then one matmul.
Any device and dtype; it saves memory at rest, not bandwidth (the fast kernels dequantize
inside the matmul instead)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class ReferenceKernel:
    name = "reference"

    def prepare(self, layer) -> None:
        pass  # reads the canonical layout

    def linear(self, layer, x: torch.Tensor) -> torch.Tensor:
        """x: (..., K) -> (..., N)."""
        return F.linear(x, layer.dequantize(), layer.bias)
