"""fp32 / bf16 matmuls for decode-shaped steps over one copy of each weight, on the compiled
micro-kernel's `packed_mm` (cpu_microkernel.cpp).

Contract: `PackedMatmul(weight, bias, micro)(x)` is `F.linear(x, weight, bias)` (to float
rounding) for x (..., K) in the weight's dtype, at every row count.  The weight is repacked once
(`pack_for_kernel`, the only copy): tiles of 16 output rows, fp32 k-major, bf16 in pairs of
inputs.  `packed_rows` reads table rows back from it, so a tied embedding and LM head stay one
table.  Why: a decode step's floor is one read of the weights, and the tiles are read as one
stream per tile where the plain (N, K) matrix was read at about half the speed at one row; the
same kernel beat MKL's fp32 and matched oneDNN's bf16 from 1 to 128 rows, and a prefill (512 to
2,048 rows) took 0.77-0.84x MKL's fp32 time and 1.1x oneDNN's bf16 (2-core EPYC, 2026-12-04,
docs/BENCHMARKS.md).
"""

from __future__ import annotations

import torch

PAIR_TILE = 16  # output rows per tile of the packed layouts (the kernel's PT)


def pack_pairs(weight: torch.Tensor) -> torch.Tensor:
    """bf16 (N, K) -> (ceil(N / 16), ceil(K / 2), 16, 2): in tile t, pair p holds (w[16t + j, 2p],
    w[16t + j, 2p + 1]) for the tile's rows j side by side; zeros past row N and input K."""
    N, K = weight.shape
    rows, cols = -(-N // PAIR_TILE) * PAIR_TILE, K + K % 2
    padded = weight.new_zeros(rows, cols)
    padded[:N, :K] = weight
    return padded.view(rows // PAIR_TILE, PAIR_TILE, cols // 2, 2).permute(0, 2, 1, 3).contiguous()


def pack_k_major(weight: torch.Tensor) -> torch.Tensor:
    """fp32 (N, K) -> (ceil(N / 16), K, 16): in tile t, input k holds w[16t + j, k] for the
    tile's rows j side by side; zeros past row N."""
    N, K = weight.shape
    rows = -(-N // PAIR_TILE) * PAIR_TILE
    padded = weight.new_zeros(rows, K)
    padded[:N] = weight
    return padded.view(rows // PAIR_TILE, PAIR_TILE, K).transpose(1, 2).contiguous()


def pack_for_kernel(weight: torch.Tensor) -> torch.Tensor:
    """The layout `packed_mm` reads for this weight's dtype: pairs for bf16, k-major for fp32."""
    if weight.dtype == torch.bfloat16:
        return pack_pairs(weight)
    if weight.dtype == torch.float32:
        return pack_k_major(weight)
    raise ValueError(f"packed_mm takes bf16 or fp32 weights, not {weight.dtype}")


def packed_rows(packed: torch.Tensor, ids: torch.Tensor, K: int) -> torch.Tensor:
    """Rows `ids` (...) of the (N, K) matrix `packed` was made from -> (..., K): row n is lane
    n % 16 of tile n // 16, at every input (or pair of inputs)."""
    if packed.dim() == 3:  # k-major
        return packed[ids // PAIR_TILE, :, ids % PAIR_TILE]  # (..., K)
    rows = packed[ids // PAIR_TILE, :, ids % PAIR_TILE, :]  # (..., ceil(K / 2), 2)
    return rows.reshape(*ids.shape, -1)[..., :K]


class PackedMatmul:
    """y = x W^T + b with W (N, K) bf16 or fp32 packed by `pack_for_kernel` (the one copy; the
    plain weight can be dropped), on the micro-kernel's `packed_mm` at every row count, x in W's
    dtype.  `num_weight_bytes` is W's own size, padding left out."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, micro):
        self.out_features, self.in_features = weight.shape
        self.packed = pack_for_kernel(weight)
        self.bias = bias  # (N,) or None
        self.micro = micro
        self.num_weight_bytes = weight.numel() * weight.element_size()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of W (an embedding lookup on a tied table) -> (..., K)."""
        return packed_rows(self.packed, ids, self.in_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.is_contiguous():  # a step's rows, as the layers pass them: no reshapes
            return self.micro.packed_mm(x, self.packed, self.out_features, self.bias)
        K = x.shape[-1]
        num_rows = x.numel() // K
        y = self.micro.packed_mm(x.reshape(num_rows, K).contiguous(), self.packed, self.out_features, self.bias)
        return y.view(*x.shape[:-1], self.out_features)  # (..., N)
