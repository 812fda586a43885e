"""The two weight formats, as pure functions: quantize, pack, unpack, dequantize.

Contract: every function takes and returns plain tensors; nothing here knows about modules,
kernels or checkpoints.  A weight is an nn.Linear matrix W of shape (N, K) = (out, in).

INT8, symmetric, one scale per output channel (row):

    scale[n] = max_k |W[n, k]| / 127          q = round(W / scale) in [-127, 127]   (int8)
    W[n, k] ~ q[n, k] * scale[n]              error |W - q * scale| <= scale / 2

INT4, asymmetric, one (scale, offset) pair per group of `group_size` consecutive inputs:

    lo, hi = min and max of the group         scale = (hi - lo) / 15,  offset = lo
    q = round((W - offset) / scale) in [0, 15]
    W[n, k] ~ q[n, k] * scale[n, g] + offset[n, g]      with g = k // group_size

Asymmetric because a group of 32-128 weights is rarely centred on zero: a symmetric code would
spend one of only 16 levels on values the group never takes.  Two 4-bit codes share a byte,
the even column in the low nibble:

    byte [n, j] = q[n, 2j] | q[n, 2j + 1] << 4          packed: (N, K / 2) uint8

A row whose length K is not a multiple of `group_size` is padded with copies of its last
value up to one (`padded_in_features`): the pad never changes a group's min or max, and the
matmul multiplies the pad by zeros (the kernels read only the first K inputs).
"""

from __future__ import annotations

import torch

INT8_MAX = 127  # symmetric: -127..127, so +x and -x get the same code magnitude
INT4_LEVELS = 15  # codes 0..15


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x rounded to what `dtype` can hold, returned in x's dtype (scales are stored that way)."""
    return x.to(dtype).to(x.dtype)


# -- INT8 -------------------------------------------------------------------------------------

def int8_scales(w: torch.Tensor, scale_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(N, K) -> (N,) float32: the per-row step, rounded to `scale_dtype` (how it is stored)."""
    absmax = w.float().abs().amax(dim=1)
    scale = (absmax / INT8_MAX).clamp(min=torch.finfo(torch.float16).tiny)  # an all-zero row
    return round_to(scale, scale_dtype)


def quantize_int8(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(N, K) float, (N,) scales -> (N, K) int8 codes."""
    q = torch.round(w.float() / scales.float()[:, None])
    return q.clamp(-INT8_MAX, INT8_MAX).to(torch.int8)


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(N, K) int8, (N,) -> (N, K) in the scales' dtype."""
    return q.to(scales.dtype) * scales[:, None]


# -- INT4 -------------------------------------------------------------------------------------

def padded_in_features(in_features: int, group_size: int) -> int:
    """K rounded up to a whole number of groups."""
    return -(-in_features // group_size) * group_size


def pad_columns(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N, K) -> (N, K_padded): repeat the last column (keeps every group's min and max)."""
    K = w.shape[1]
    num_pad = padded_in_features(K, group_size) - K
    if num_pad == 0:
        return w
    return torch.cat([w, w[:, -1:].expand(-1, num_pad)], dim=1)


def int4_params(
    w: torch.Tensor,
    group_size: int,
    clip_ratio: torch.Tensor | float = 1.0,
    scale_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) -> scales, offsets: (N, num_groups) float32 each, rounded to `scale_dtype`.

    `clip_ratio` (a number or (N, num_groups)) shrinks each group's range [lo, hi] to
    [lo * r, hi * r]: values outside are clamped, the rest get finer steps (calibration picks r).
    """
    N = w.shape[0]
    groups = pad_columns(w.float(), group_size).view(N, -1, group_size)  # (N, G, group)
    lo, hi = groups.amin(-1) * clip_ratio, groups.amax(-1) * clip_ratio  # (N, G)
    scale = ((hi - lo) / INT4_LEVELS).clamp(min=torch.finfo(torch.float16).tiny)
    return round_to(scale, scale_dtype), round_to(lo, scale_dtype)


def quantize_int4(w: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
                  group_size: int) -> torch.Tensor:
    """(N, K) float -> (N, K_padded) codes 0..15 as uint8 (one code per byte: unpacked)."""
    N = w.shape[0]
    groups = pad_columns(w.float(), group_size).view(N, -1, group_size)
    q = torch.round((groups - offsets.float()[..., None]) / scales.float()[..., None])
    return q.clamp(0, INT4_LEVELS).to(torch.uint8).view(N, -1)


def dequantize_int4(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
                    in_features: int) -> torch.Tensor:
    """(N, K_padded) codes -> (N, in_features) weights in the scales' dtype (pad dropped)."""
    N, K_padded = codes.shape
    group_size = K_padded // scales.shape[1]
    groups = codes.view(N, -1, group_size).to(scales.dtype)
    w = groups * scales[..., None] + offsets[..., None]
    return w.view(N, K_padded)[:, :in_features]


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) codes 0..15 (K even) -> (N, K / 2) uint8, even column in the low nibble."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(N, K / 2) uint8 -> (N, K) codes 0..15 as uint8."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).view(packed.shape[0], -1)  # interleave: 2j, 2j+1
