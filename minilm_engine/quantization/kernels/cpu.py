"""CPU fast path: torch's own weight-only matmul operators (as gpt-fast uses them), and a
reused scratch buffer for many rows.

Contract: `CPUKernel.linear(layer, x)` equals the reference up to float rounding, on every CPU
torch runs on, with one copy of each weight in memory.

    rows of x           what runs                                     why
    int8 <= 8,          aten._weight_int8pack_mm /                    they read int8 / packed int4
    int4 <= 64,         _weight_int4pack_mm_for_cpu                   straight from memory and
    bf16 activations    (decode of a few or a few dozen requests)     dequantize in registers
    more                dequantize into one scratch buffer the        the operators' cost grows with
                        kernel reuses (no allocation per call), one   every row (~0.04 ms a row for a
                        BLAS matmul (prefill, perplexity runs)        3072 x 1024 layer, on AVX-512),
                                                                      BLAS's barely does

    With fp32 activations (the CPU default) the operators are not vectorized: at one row of a
    3072 x 1024 layer, 1.0 ms (int8) and 2.6 ms (int4) against 0.56 ms for the scratch path, so
    fp32 always takes the scratch path.  The crossovers for bf16, measured on a 2-core AVX-512
    CPU (3072 x 1024 layer):
    int8 codes convert to floats in one cheap pass (~0.25 ms), so BLAS wins from ~10 rows; int4
    codes must be unpacked from the operator's tiles and scaled per group (~2.3 ms), so the
    operator wins up to ~80 rows.  Outputs agree either way (up to float rounding).

    int8: _weight_int8pack_mm(x (M, K), qweight (N, K) int8, scales (N,)) reads our canonical
          layout as it is; many rows: y = (x @ codes.T) * scales, the per-channel scale applied
          to the (M, N) output instead of the (N, K) weight.
    int4: _weight_int4pack_mm_for_cpu(x (M, K_padded), packed, group_size, scales_and_zeros)
          wants its own tiled packing, made by torch's own _convert_weight_to_int4pack_for_cpu,
          and (G, N, 2) pairs meaning w = (q - 8) * scale + zero, so zero = offset + 8 * scale in
          our terms.  That packing differs between CPUs: tiles of BLOCK_N rows, for each input
          k the BLOCK_N / 2 bytes `row d | row d + BLOCK_N / 2 << 4`, with BLOCK_N 32 on AVX2
          and 64 on AVX-512.  `prepare` pads N to a multiple of 64 (so every tile is whole, on
          either CPU), packs with the operator, and *learns* which BLOCK_N it used by comparing
          with `to_cpu_int4_layout`; the canonical buffers are then dropped.  On a CPU whose
          packing is neither, it keeps only the packed weight too, and dequantizes for many rows
          by running the operator on an identity matrix (slow, exact, and said in a warning).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from .. import schemes

CPU_OP_MAX_ROWS = {"int8": 8, "int4": 64}  # up to this many rows of x, the operators; beyond, BLAS
OPERATOR_DTYPES = (torch.bfloat16,)  # activations the operators are fast for (others: BLAS always)
INT4_ROW_PAD = 64  # N is padded to a multiple of this: whole tiles for BLOCK_N 32 and 64
INT4_BLOCK_NS = (32, 64)  # the packings torch's CPU operator is known to use (AVX2, AVX-512)
SCRATCH_MAX_ELEMENTS = 1 << 22  # the scratch holds at most 4 Mi weights: bigger layers go in row tiles


def unavailable_reason() -> str | None:
    missing = [
        name
        for name in ("_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu")
        if not hasattr(torch.ops.aten, name)
    ]
    if missing:
        return f"this torch ({torch.__version__}) lacks the CPU operators {missing}"
    return None


def to_cpu_int4_layout(codes: torch.Tensor, block_n: int) -> torch.Tensor:
    """(N, K) codes, N a multiple of block_n -> (N, K / 2) uint8 in the operator's tiled order.

        tile t = rows [t * block_n, (t + 1) * block_n),  half = block_n / 2
        bytes of tile t, input k:  [ row d | row d + half << 4  for d in 0 .. half - 1 ]
    """
    N, K = codes.shape
    half = block_n // 2
    b = codes.to(torch.uint8).view(N // block_n, 2, half, K)  # (tiles, low/high, d, k)
    packed = b[:, 0] | (b[:, 1] << 4)  # (tiles, d, k)
    return packed.transpose(1, 2).contiguous().view(N, K // 2)


def from_cpu_int4_layout(packed: torch.Tensor, block_n: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The inverse: (N, K / 2) uint8 in the operator's order -> (N, K) codes (uint8, or written
    into `out`, any dtype, converted on the way)."""
    N, K = packed.shape[0], packed.shape[1] * 2
    half = block_n // 2
    b = packed.view(N // block_n, K, half)  # (tiles, k, d)
    if out is None:
        out = torch.empty(N, K, dtype=torch.uint8, device=packed.device)
    view = out.view(N // block_n, 2, half, K)  # (tiles, low/high, d, k)
    view[:, 0].copy_((b & 0x0F).transpose(1, 2))
    view[:, 1].copy_((b >> 4).transpose(1, 2))
    return out


def learn_block_n(codes: torch.Tensor, packed: torch.Tensor) -> int | None:
    """Which known tiling turned `codes` (N, K) into `packed`, or None if none did."""
    for block_n in INT4_BLOCK_NS:
        if codes.shape[0] % block_n == 0 and torch.equal(packed, to_cpu_int4_layout(codes, block_n)):
            return block_n
    return None


class CPUKernel:
    """Holds one scratch buffer (grown on demand, reused by every layer) for the many-row path.
    Invariant after `prepare`: an int8 layer keeps its canonical buffers; an int4 layer holds
    only `cpu_qweight` (N_padded, K_padded / 2) and `cpu_scales_and_zeros` (G, N_padded, 2),
    with `layer.cpu_block_n` the tiling learned from the operator (None: an unknown one)."""

    name = "cpu"

    def __init__(self):
        self._scratch: torch.Tensor | None = None

    def prepare(self, layer) -> None:
        if layer.scheme == "int8":
            return  # the operator reads the canonical (N, K) int8 codes and (N,) scales
        num_pad = -layer.out_features % INT4_ROW_PAD
        codes = schemes.unpack_int4(layer.qweight).to(torch.int32)  # (N, K_padded)
        codes = F.pad(codes, (0, 0, 0, num_pad))  # (N_padded, K_padded)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)  # inner k tiles: 1
        zeros = layer.offsets + 8 * layer.scales  # the operator centres codes on 8
        scales_and_zeros = torch.stack([layer.scales.t(), zeros.t()], dim=-1)  # (G, N, 2)
        scales_and_zeros = F.pad(scales_and_zeros, (0, 0, 0, num_pad)).contiguous()  # (G, N_padded, 2)
        layer.cpu_block_n = learn_block_n(codes, packed)
        if layer.cpu_block_n is None:
            warnings.warn(
                "torch's int4 CPU packing on this machine is not one this kernel knows "
                f"(tiles of {INT4_BLOCK_NS} rows); decode keeps the fast operator, but inputs of "
                f"more than {CPU_OP_MAX_ROWS['int4']} rows dequantize slowly through it",
                stacklevel=2,
            )
        layer.register_buffer("cpu_qweight", packed, persistent=False)
        layer.register_buffer("cpu_scales_and_zeros", scales_and_zeros, persistent=False)
        for name in ("qweight", "scales", "offsets"):
            delattr(layer, name)  # one copy of the weight: the operator's

    # ------------------------------------------------------------------ dequantize
    def scratch(self, num_elements: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat buffer of at least `num_elements` in `dtype`, reused across calls and layers."""
        s = self._scratch
        # An inference-mode tensor cannot be written outside inference mode (nor the reverse
        # be saved for autograd), so a change of mode takes a fresh buffer.
        if s is None or s.dtype != dtype or s.numel() < num_elements or s.is_inference() != torch.is_inference_mode_enabled():
            self._scratch = torch.empty(num_elements, dtype=dtype)
        return self._scratch[:num_elements]

    def dequantize(self, layer, dtype: torch.dtype | None = None, rows: slice | None = None) -> torch.Tensor:
        """(n, K) weight rows `rows` (default: all N) in `dtype` (default: the layer's), read from
        the layout the layer holds.  The result may be the kernel's scratch buffer: use it
        before the next call."""
        N, K = layer.out_features, layer.in_features
        start, stop, _ = (rows or slice(0, N)).indices(N)
        if layer.scheme == "int8":
            dtype = dtype or layer.scales.dtype
            return self._int8_codes(layer, slice(start, stop), dtype).mul_(layer.scales[start:stop, None].to(dtype))
        scales, zeros = layer.cpu_scales_and_zeros.unbind(-1)  # (G, N_padded) each
        dtype = dtype or scales.dtype
        if layer.cpu_block_n is None:
            return self._dequantize_through_operator(layer, dtype)[start:stop]
        # Whole tiles around the rows asked for: the packing is tiled by rows.
        block_n = layer.cpu_block_n
        tile_start, tile_stop = start // block_n * block_n, -(-stop // block_n) * block_n
        K_padded = layer.padded_in_features
        codes = self.scratch((tile_stop - tile_start) * K_padded, dtype).view(-1, K_padded)
        from_cpu_int4_layout(layer.cpu_qweight[tile_start:tile_stop], block_n, out=codes)
        codes = codes[start - tile_start : stop - tile_start]  # (n, K_padded)
        num_groups = scales.shape[0]
        groups = codes.view(stop - start, num_groups, -1)  # (n, G, group)
        groups.sub_(8).mul_(scales.t()[start:stop, :, None].to(dtype)).add_(zeros.t()[start:stop, :, None].to(dtype))
        return codes[:, :K]

    def _int8_codes(self, layer, rows: slice, dtype: torch.dtype) -> torch.Tensor:
        """(n, K) the int8 codes of `rows` as `dtype`, in the scratch (small integers: exact)."""
        w = self.scratch((rows.stop - rows.start) * layer.in_features, dtype).view(-1, layer.in_features)
        return w.copy_(layer.qweight[rows])

    def _dequantize_through_operator(self, layer, dtype: torch.dtype) -> torch.Tensor:
        """(N, K): the operator applied to the identity gives W.T, whatever its packing."""
        K_padded = layer.padded_in_features
        eye = torch.eye(K_padded, dtype=dtype)
        w_t = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, layer.cpu_qweight, layer.group_size, layer.cpu_scales_and_zeros)
        return w_t[: layer.in_features, : layer.out_features].t()

    # ------------------------------------------------------------------ matmul
    def linear(self, layer, x: torch.Tensor) -> torch.Tensor:
        """x: (..., K) -> (..., N)."""
        lead, K = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, K).contiguous()  # (M, K): the operators take a matrix
        if x2.shape[0] > CPU_OP_MAX_ROWS[layer.scheme] or x2.dtype not in OPERATOR_DTYPES:
            y = self._many_rows(layer, x2)
        elif layer.scheme == "int8":
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

    def _many_rows(self, layer, x: torch.Tensor) -> torch.Tensor:
        """(M, K) -> (M, N): dequantize a tile of rows into the scratch, one matmul per tile."""
        N, K = layer.out_features, layer.in_features
        tile = max(INT4_ROW_PAD, SCRATCH_MAX_ELEMENTS // max(K, 1) // INT4_ROW_PAD * INT4_ROW_PAD)
        if layer.scheme == "int4" and layer.cpu_block_n is None:
            tile = N  # an unknown packing is read whole, through the operator: no tile is cheaper
        if tile >= N:
            return self._tile_matmul(layer, x, slice(0, N))
        y = torch.empty(x.shape[0], N, dtype=x.dtype)
        for start in range(0, N, tile):
            rows = slice(start, min(start + tile, N))
            y[:, rows] = self._tile_matmul(layer, x, rows)
        return y

    def _tile_matmul(self, layer, x: torch.Tensor, rows: slice) -> torch.Tensor:
        if layer.scheme == "int8":
            # The scale is per output row, so it multiplies the (M, n) product instead of the
            # (n, K) weight.
            return F.linear(x, self._int8_codes(layer, rows, x.dtype)) * layer.scales[rows].to(x.dtype)
        return F.linear(x, self.dequantize(layer, x.dtype, rows))
