"""Triton kernels: weight-only dequantizing matmul, y = x @ dequant(W).T, INT8 and INT4.

Contract: `weight_only_linear(x, layer)` returns what `ReferenceKernel.linear` returns (up to
float rounding) for a `QuantizedLinear` in the canonical layout (linear.py), dequantizing each
tile of codes in registers, never writing the float weight to memory.

    x (M, K)  ──────────────────────────────┐
    codes (N, K) int8  or (N, K/2) uint8 ─ dequant tile (BLOCK_N, BLOCK_K) in fp32 ─ dot ─ y (M, N)
    scales, offsets (per row, or per row and group) ┘

INT4 codes: byte j of a row holds column 2j in its low nibble and 2j + 1 in its high one, so
column k is `(byte[k // 2] >> 4 * (k % 2)) & 15`; its group is k // group_size.  Columns past
K (the pad of a ragged last group) are masked, never read.

Two kernels, by the number of rows M: `gemv` (M <= 4: one program per BLOCK_N outputs and row,
a product and a sum over K, as `tl.dot`'s tiles of >= 16 rows would waste 15 of 16) and
`matmul` (M > 4: BLOCK_M x BLOCK_N tiles with `tl.dot`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

GEMV_MAX_ROWS = 4


@triton.jit
def _dequantized_tile(qw_ptr, scales_ptr, offsets_ptr, rn, rk, N, K, stride_qn, stride_sn,
                      GROUP_SIZE: tl.constexpr, IS_INT4: tl.constexpr):
    """Rows rn, columns rk of the weight, as fp32: (BLOCK_N, BLOCK_K); 0 outside (N, K)."""
    mask = (rn[:, None] < N) & (rk[None, :] < K)
    if IS_INT4:
        byte = tl.load(qw_ptr + rn[:, None] * stride_qn + (rk // 2)[None, :], mask=mask, other=0)
        code = (byte.to(tl.int32) >> ((rk % 2) * 4)[None, :]) & 15
        group = rn[:, None] * stride_sn + (rk // GROUP_SIZE)[None, :]
        scale = tl.load(scales_ptr + group, mask=mask, other=0.0).to(tl.float32)
        offset = tl.load(offsets_ptr + group, mask=mask, other=0.0).to(tl.float32)
        w = code.to(tl.float32) * scale + offset
    else:
        code = tl.load(qw_ptr + rn[:, None] * stride_qn + rk[None, :], mask=mask, other=0)
        scale = tl.load(scales_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        w = code.to(tl.float32) * scale[:, None]
    return tl.where(mask, w, 0.0)


@triton.jit
def gemv_kernel(y_ptr, x_ptr, qw_ptr, scales_ptr, offsets_ptr, N, K,
                stride_xm, stride_ym, stride_qn, stride_sn,
                GROUP_SIZE: tl.constexpr, IS_INT4: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n, m = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + m * stride_xm + rk, mask=rk < K, other=0.0).to(tl.float32)  # (BLOCK_K,)
        w = _dequantized_tile(qw_ptr, scales_ptr, offsets_ptr, rn, rk, N, K, stride_qn, stride_sn,
                              GROUP_SIZE, IS_INT4)  # (BLOCK_N, BLOCK_K)
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(y_ptr + m * stride_ym + rn, acc.to(y_ptr.dtype.element_ty), mask=rn < N)


@triton.jit
def matmul_kernel(y_ptr, x_ptr, qw_ptr, scales_ptr, offsets_ptr, M, N, K,
                  stride_xm, stride_ym, stride_qn, stride_sn,
                  GROUP_SIZE: tl.constexpr, IS_INT4: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  DOT_FP32: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :],
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)  # (BLOCK_M, BLOCK_K)
        w = _dequantized_tile(qw_ptr, scales_ptr, offsets_ptr, rn, rk, N, K, stride_qn, stride_sn,
                              GROUP_SIZE, IS_INT4)  # (BLOCK_N, BLOCK_K) fp32
        if DOT_FP32:  # fp32 models, and bf16 in the interpreter (which gets bf16 dots wrong)
            acc += tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")
        else:  # fp16 / bf16 tensor cores
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def is_interpreted() -> bool:
    """Whether these kernels were compiled for the CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return type(gemv_kernel).__name__ == "InterpretedFunction"


def unavailable_reason(device: torch.device) -> str | None:
    if device.type == "cuda":
        if is_interpreted():
            return "Triton was imported under TRITON_INTERPRET=1, which runs on the CPU only"
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 0):
            return (f"this GPU has compute capability {major}.{minor} (a T4 is 7.5); the "
                    "weight-only Triton kernels need 8.0 or newer")
        return None
    if device.type == "cpu" and is_interpreted():
        return None
    return f"the Triton kernels run on a CUDA GPU, or on the CPU under TRITON_INTERPRET=1; this model is on {device}"


def weight_only_linear(x: torch.Tensor, layer) -> torch.Tensor:
    """x: (..., K) -> (..., N) for a QuantizedLinear `layer` in the canonical layout."""
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M, N = x2.shape[0], layer.out_features
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    is_int4 = layer.scheme == "int4"
    offsets = layer.offsets if is_int4 else layer.scales  # unused by the int8 branch
    stride_sn = layer.scales.stride(0)
    common = dict(GROUP_SIZE=layer.group_size or 1, IS_INT4=is_int4)
    if M == 0:
        return y.view(*lead, N)
    if M <= GEMV_MAX_ROWS:
        BLOCK_N, BLOCK_K = 16, 128
        grid = (triton.cdiv(N, BLOCK_N), M)
        gemv_kernel[grid](y, x2, layer.qweight, layer.scales, offsets, N, K,
                          x2.stride(0), y.stride(0), layer.qweight.stride(0), stride_sn,
                          BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, **common)
    else:
        BLOCK_M = 16 if M <= 16 else 64
        BLOCK_N, BLOCK_K = 64, 64
        grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
        dot_fp32 = x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and is_interpreted())
        matmul_kernel[grid](y, x2, layer.qweight, layer.scales, offsets, M, N, K,
                            x2.stride(0), y.stride(0), layer.qweight.stride(0), stride_sn,
                            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, DOT_FP32=dot_fp32,
                            **common)
    if layer.bias is not None:
        y += layer.bias
    return y.view(*lead, N)


class TritonKernel:
    name = "triton"

    def prepare(self, layer) -> None:
        pass  # reads the canonical layout

    def linear(self, layer, x: torch.Tensor) -> torch.Tensor:
        return weight_only_linear(x, layer)
