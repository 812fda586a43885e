"""CPU fast path: torch's own weight-only matmul operators (as gpt-fast uses them).

Contract: `CPUKernel.linear(layer, x)` equals the reference up to float rounding.  For a few
rows (decode of one or two requests) it calls the operators, which read int8 / packed int4
weights straight from memory and dequantize in registers; for more rows (prefill, batched
decode, perplexity runs) it dequantizes once and makes one BLAS call, because the operators'
cost grows with every row (measured on an AVX2 CPU: at 16 rows they were ~10x slower than
dequantize-then-matmul, at 1 row ~5x faster).

    int8: aten._weight_int8pack_mm(x (M, K), qweight (N, K) int8, scales (N,))
          reads our canonical layout as it is.
    int4: aten._weight_int4pack_mm_for_cpu(x (M, K_padded), packed, group_size, scales_and_zeros)
          wants its own tiled packing (from aten._convert_weight_to_int4pack_for_cpu, fed one
          int32 code per weight) and (G, N, 2) pairs meaning w = (q - 8) * scale + zero, so
          zero = offset + 8 * scale in our terms.  The packing needs N to be a multiple of 32
          here: other layers get zero rows, cut from the output.  Blocks of 32 rows, for each
          input k the 16 bytes `row d | row d + 16 << 4` (`to_cpu_int4_layout`); `prepare`
          checks the operator agrees, then drops the canonical buffers (one copy of the
          weight); where it does not (another torch or CPU), it keeps them for the many-row path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import schemes

CPU_OP_MAX_ROWS = 2  # up to this many rows of x, the operators; beyond, dequantize + BLAS
INT4_ROW_BLOCK = 32


def unavailable_reason() -> str | None:
    missing = [
        name
        for name in ("_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu")
        if not hasattr(torch.ops.aten, name)
    ]
    if missing:
        return f"this torch ({torch.__version__}) lacks the CPU operators {missing}"
    return None


def to_cpu_int4_layout(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) codes, N a multiple of 32 -> (N, K / 2) uint8 in the operator's tiled order."""
    N, K = codes.shape
    b = codes.to(torch.uint8).view(N // INT4_ROW_BLOCK, 2, INT4_ROW_BLOCK // 2, K)  # (blocks, half, d, k)
    packed = b[:, 0] | (b[:, 1] << 4)  # (blocks, d, k)
    return packed.transpose(1, 2).contiguous().view(N, K // 2)


def from_cpu_int4_layout(packed: torch.Tensor) -> torch.Tensor:
    """The inverse: (N, K / 2) uint8 in the operator's order -> (N, K) codes (uint8)."""
    N, K = packed.shape[0], packed.shape[1] * 2
    b = packed.view(N // INT4_ROW_BLOCK, K, INT4_ROW_BLOCK // 2).transpose(1, 2)  # (blocks, d, k)
    return torch.stack([b & 0x0F, b >> 4], dim=1).reshape(N, K)


class CPUKernel:
    name = "cpu"

    def prepare(self, layer) -> None:
        if layer.scheme == "int8":
            return  # the operator reads the canonical (N, K) int8 codes and (N,) scales
        num_pad = -layer.out_features % INT4_ROW_BLOCK
        codes = schemes.unpack_int4(layer.qweight).to(torch.int32)  # (N, K_padded)
        codes = F.pad(codes, (0, 0, 0, num_pad))  # (N_padded, K_padded)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)  # inner k tiles: 1
        zeros = layer.offsets + 8 * layer.scales  # the operator centres codes on 8
        scales_and_zeros = torch.stack([layer.scales.t(), zeros.t()], dim=-1)  # (G, N, 2)
        scales_and_zeros = F.pad(scales_and_zeros, (0, 0, 0, num_pad)).contiguous()  # (G, N_padded, 2)
        layer.register_buffer("cpu_qweight", packed, persistent=False)
        layer.register_buffer("cpu_scales_and_zeros", scales_and_zeros, persistent=False)
        if torch.equal(packed, to_cpu_int4_layout(codes)):
            for name in ("qweight", "scales", "offsets"):
                delattr(layer, name)

    def dequantize(self, layer) -> torch.Tensor:
        """(N, K) weight in the layer's dtype, from whichever layout the layer holds."""
        if layer.scheme == "int8" or hasattr(layer, "qweight"):
            return layer.dequantize()
        codes = from_cpu_int4_layout(layer.cpu_qweight)  # (N_padded, K_padded)
        scales, zeros = layer.cpu_scales_and_zeros.unbind(-1)  # (G, N_padded) each
        N, K = layer.out_features, layer.in_features
        groups = codes[:N].view(N, scales.shape[0], -1).to(scales.dtype) - 8  # (N, G, group)
        w = groups * scales.t()[:N, :, None] + zeros.t()[:N, :, None]
        return w.view(N, -1)[:, :K]

    def linear(self, layer, x: torch.Tensor) -> torch.Tensor:
        """x: (..., K) -> (..., N)."""
        lead, K = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, K).contiguous()  # (M, K): the operators take a matrix
        if x2.shape[0] > CPU_OP_MAX_ROWS:
            return F.linear(x, self.dequantize(layer), layer.bias)
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
