"""Triton kernels: the fused path's small ops on a GPU, one launch each.

Contract: `TRITON_OPS` has the three functions the CPU micro-kernel gives the fused path
(`model/fused.py`), with the same arguments and results, on CUDA tensors (or CPU ones under
TRITON_INTERPRET=1, for the tests):

    rms_norm(x (..., D), weight (H, D), eps)      -> decoder.RMSNorm(x), row r by weight[r % H]
    norm_rotary_(x (T, H, D), weight | None, eps, cos (T, D), sin (T, D))
                                                  -> x, each head normalised by weight[h] (when
                                                     given) then rotated, in place
    silu_mul(x (..., 2 I))                        -> silu(gate) * up (..., I)

Why: at batch 1 on an H200 a decode step was ~1,630 kernels, ~2.4 us each, and four fifths of
them were the readable model's elementwise ops (an RMSNorm is 8: to float, pow, mean, add,
rsqrt, mul, to bf16, mul; rotary 10).  Each launch costs more than its arithmetic.

The arithmetic is the readable model's, rounding to x's dtype where it rounds (the sum of
squares is summed in another order: equal to rounding).  One program handles one row: D (or
half of it, for rotary) padded to a power of two and masked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, H, D, eps, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + (row % H) * D + cols, mask=mask, other=0.0).to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    normed = (x * scale).to(out_ptr.dtype.element_ty).to(tl.float32)  # decoder.RMSNorm rounds here
    tl.store(out_ptr + row * D + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_rotary_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, stride_token, H, D, eps,
                        HAS_NORM: tl.constexpr, BLOCK_HALF: tl.constexpr):
    program = tl.program_id(0).to(tl.int64)
    token, head = program // H, program % H
    half = D // 2
    cols = tl.arange(0, BLOCK_HALF)
    mask = cols < half
    dtype = x_ptr.dtype.element_ty
    row = x_ptr + token * stride_token + head * D
    lo = tl.load(row + cols, mask=mask, other=0.0).to(tl.float32)  # x[:half]
    hi = tl.load(row + half + cols, mask=mask, other=0.0).to(tl.float32)  # x[half:]
    if HAS_NORM:
        scale = 1.0 / tl.sqrt((tl.sum(lo * lo, axis=0) + tl.sum(hi * hi, axis=0)) / D + eps)
        w_lo = tl.load(w_ptr + head * D + cols, mask=mask, other=0.0).to(tl.float32)
        w_hi = tl.load(w_ptr + head * D + half + cols, mask=mask, other=0.0).to(tl.float32)
        lo = (w_lo * (lo * scale).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        hi = (w_hi * (hi * scale).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    c_lo = tl.load(cos_ptr + token * D + cols, mask=mask, other=0.0).to(tl.float32)
    c_hi = tl.load(cos_ptr + token * D + half + cols, mask=mask, other=0.0).to(tl.float32)
    s_lo = tl.load(sin_ptr + token * D + cols, mask=mask, other=0.0).to(tl.float32)
    s_hi = tl.load(sin_ptr + token * D + half + cols, mask=mask, other=0.0).to(tl.float32)
    # x * cos + rotate_half(x) * sin, rotate_half(x) = (-hi, lo); each product rounded, as torch does
    new_lo = (lo * c_lo).to(dtype).to(tl.float32) + (-hi * s_lo).to(dtype).to(tl.float32)
    new_hi = (hi * c_hi).to(dtype).to(tl.float32) + (lo * s_hi).to(dtype).to(tl.float32)
    tl.store(row + cols, new_lo.to(dtype), mask=mask)
    tl.store(row + half + cols, new_hi.to(dtype), mask=mask)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, I, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * 2 * I + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * I + I + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)  # F.silu rounds, then the product
    tl.store(out_ptr + row * I + cols, (silu * up).to(dtype), mask=mask)


class TritonFusedOps:
    """The fused path's small ops as Triton kernels (the CPU micro-kernel's signatures)."""

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x (..., D) contiguous, weight (H, D) in x's dtype -> (..., D), row r by weight[r % H]."""
        if not x.is_contiguous() or weight.dtype != x.dtype:
            raise ValueError("x must be contiguous and weight of x's dtype")
        D = x.shape[-1]
        rows, H = x.numel() // D, weight.numel() // D
        if H * D != weight.numel() or (rows and rows % H):
            raise ValueError(f"weight must be (H, D) with H dividing x's rows; got {tuple(weight.shape)}")
        out = torch.empty_like(x)
        if rows:
            _rms_norm_kernel[(rows,)](x, weight.contiguous(), out, H, D, eps, BLOCK_D=triton.next_power_of_2(D))
        return out

    @staticmethod
    def norm_rotary_(x: torch.Tensor, weight: torch.Tensor | None, eps: float, cos: torch.Tensor,
                     sin: torch.Tensor) -> torch.Tensor:
        """x (T, H, D), heads dense (a view of the fused qkv output), in place -> x."""
        T, H, D = x.shape
        if x.stride(-1) != 1 or x.stride(-2) != D:
            raise ValueError("x must be (T, H, D) with its heads dense")
        if D % 2 or cos.shape != (T, D) or sin.shape != (T, D) or cos.dtype != x.dtype:
            raise ValueError(f"cos and sin must be ({T}, {D}) in x's dtype, D even")
        if weight is not None and (weight.numel() != H * D or weight.dtype != x.dtype):
            raise ValueError(f"weight must be ({H}, {D}) in x's dtype")
        if T:
            _norm_rotary_kernel[(T * H,)](
                x, x if weight is None else weight.contiguous(), cos.contiguous(), sin.contiguous(),
                x.stride(0), H, D, eps, HAS_NORM=weight is not None, BLOCK_HALF=triton.next_power_of_2(D // 2))
        return x

    @staticmethod
    def silu_mul(x: torch.Tensor) -> torch.Tensor:
        """x (..., 2 I) contiguous, gate then up -> silu(gate) * up (..., I)."""
        if not x.is_contiguous() or x.shape[-1] % 2:
            raise ValueError("x must be contiguous (..., 2 I)")
        I = x.shape[-1] // 2
        rows = x.numel() // (2 * I)
        out = x.new_empty(*x.shape[:-1], I)
        block = min(1024, triton.next_power_of_2(I))
        if rows:
            _silu_mul_kernel[(rows, triton.cdiv(I, block))](x, out, I, BLOCK=block)
        return out


TRITON_OPS = TritonFusedOps()
