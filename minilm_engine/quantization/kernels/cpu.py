"""CPU fast path: torch's own weight-only matmul operators (as gpt-fast uses them).

Contract: `CPUKernel.linear(layer, x)` equals the reference up to float rounding, without
building the float weight.  The operators read int8 / packed int4 weights straight from memory
and dequantize in registers, which is what decode at batch 1 needs: it is bound by the bytes
of weight it reads per token.

    int8: aten._weight_int8pack_mm(x (M, K), qweight (N, K) int8, scales (N,))
          reads our canonical layout as it is.
    int4: aten._weight_int4pack_mm_for_cpu(x (M, K_padded), packed, group_size, scales_and_zeros)
          wants its own tiled packing (from aten._convert_weight_to_int4pack_for_cpu, fed one
          int32 code per weight) and (G, N, 2) pairs meaning w = (q - 8) * scale + zero, so
          zero = offset + 8 * scale in our terms.  `prepare` converts once and drops the
          canonical buffers, so the layer holds one copy of its weight.  The packing needs N
          to be a multiple of 16: other layers get zero rows, cut from the output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import schemes


def unavailable_reason() -> str | None:
    missing = [
        name
        for name in ("_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu")
        if not hasattr(torch.ops.aten, name)
    ]
    if missing:
        return f"this torch ({torch.__version__}) lacks the CPU operators {missing}"
    return None


class CPUKernel:
    name = "cpu"

    def prepare(self, layer) -> None:
        if layer.scheme == "int8":
            return  # the operator reads the canonical (N, K) int8 codes and (N,) scales
        num_pad = -layer.out_features % 16
        codes = schemes.unpack_int4(layer.qweight).to(torch.int32)  # (N, K_padded)
        codes = F.pad(codes, (0, 0, 0, num_pad))  # (N_padded, K_padded)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)  # inner k tiles: 1
        zeros = layer.offsets + 8 * layer.scales  # the operator centres codes on 8
        scales_and_zeros = torch.stack([layer.scales.t(), zeros.t()], dim=-1)  # (G, N, 2)
        scales_and_zeros = F.pad(scales_and_zeros, (0, 0, 0, num_pad)).contiguous()  # (G, N_padded, 2)
        for name in ("qweight", "scales", "offsets"):
            delattr(layer, name)
        layer.register_buffer("cpu_qweight", packed, persistent=False)
        layer.register_buffer("cpu_scales_and_zeros", scales_and_zeros, persistent=False)

    def linear(self, layer, x: torch.Tensor) -> torch.Tensor:
        """x: (..., K) -> (..., N)."""
        lead, K = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, K).contiguous()  # (M, K): the operators take a matrix
        if layer.scheme == "int8":
            y = torch.ops.aten._weight_int8pack_mm(x2, layer.qweight, layer.scales)
        else:
            K_padded = layer.padded_in_features
            if K_padded != K:
                x2 = F.pad(x2, (0, K_padded - K))  # the pad columns multiply zeros
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2, layer.cpu_qweight, layer.group_size, layer.cpu_scales_and_zeros
            )[:, : layer.out_features]
        if layer.bias is not None:
            y = y + layer.bias
        return y.view(*lead, layer.out_features)
