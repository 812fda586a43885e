"""CPU fast path: a compiled micro-kernel that dequantizes in registers (cpu_microkernel.cpp),
torch's own weight-only operators where it cannot be built, and a reused scratch buffer for
many rows.

Contract: `CPUKernel.linear(layer, x)` equals the reference up to float rounding, on every CPU
torch runs on, with one copy of each weight in memory.

    rows of x (M)                 what runs                                 why
    up to microkernel_max_rows    the micro-kernel (fp32 or bf16 x)         reads each code once per
                                                                            call for all the rows
    no micro-kernel, bf16 x,      aten._weight_int8pack_mm /                no build needed
    int8 <= 16, int4 <= 96        _weight_int4pack_mm_for_cpu
    more                          dequantize a tile into a reused scratch   BLAS at its peak
                                  buffer, one BLAS matmul per tile          (prefill, perplexity)

    int8: with the micro-kernel the codes are (ceil(N / 16), K, 16) tiles (`tile_int8`), else
          the canonical (N, K) the operator reads; many rows: (x @ codes.T) * scales.
    int4: torch's tiled packing (`_convert_weight_to_int4pack_for_cpu`) with its (G, N, 2)
          table, w = (q - 8) * scale + zero (zero = offset + 8 * scale); the micro-kernel reads
          the same buffers.  The packing differs between CPUs (`Int4Layout`), so `prepare` pads
          N to a multiple of 64, packs with the operator and *learns* the layout by comparing
          with `to_cpu_int4_layout`; an unknown one dequantizes through the operator (slow,
          exact, said in a warning).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minilm_engine.model.device import native_bf16_matmul  # a name of this module: tests patch it here
from minilm_engine.model.quantization import schemes
from minilm_engine.model.quantization.kernels import cpu_compiled

MICROKERNEL_MAX_ROWS = 64  # rows the micro-kernel always takes; beyond, see microkernel_max_rows
MICROKERNEL_DTYPES = (torch.float32, torch.bfloat16)
INT8_TILE_ROWS = 16  # the micro-kernel's int8 tiles: 16 output rows, k-major
CPU_OP_MAX_ROWS = {"int8": 16, "int4": 96}  # up to this many rows of x, the operators; beyond, BLAS
OPERATOR_DTYPES = (torch.bfloat16,)  # activations the operators are fast for (others: BLAS always)
INT4_ROW_PAD = 64  # N is padded to a multiple of this: whole tiles for BLOCK_N 32 and 64
SCRATCH_MAX_ELEMENTS = 1 << 22  # the scratch holds at most 4 Mi weights: bigger layers go in row tiles


@dataclass(frozen=True)
class Int4Layout:
    """How torch's CPU packing orders int4 codes: tiles of `block_n` weight rows; in a tile,
    for each input k, block_n / 2 bytes, byte d holding two rows (the first in the low nibble):
    rows (d, d + block_n / 2) when `pairs` is False (AVX2: 32, AVX-512: 64), rows (2d, 2d + 1)
    when it is True (a torch run without vector code: ATEN_CPU_CAPABILITY=default)."""

    block_n: int
    pairs: bool = False


# The packings torch's CPU operator is known to use: AVX-512, AVX2, non-vectorized.
KNOWN_INT4_LAYOUTS = (Int4Layout(64), Int4Layout(32), Int4Layout(32, pairs=True))


def tile_int8(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 codes -> (ceil(N / 16), K, 16): tiles of 16 rows, k-major, the last one
    padded with zero codes (the micro-kernel's layout: 16 outputs' weights for one k adjacent)."""
    N, K = codes.shape
    padded = F.pad(codes, (0, 0, 0, -N % INT8_TILE_ROWS))
    return padded.view(-1, INT8_TILE_ROWS, K).transpose(1, 2).contiguous()


NATIVE_BF16_MAX_ROWS = {"int8": 16, "int4": 0}  # bf16 x, native bf16 matmuls, fp32 micro-kernel
BF16_DOT_MAX_ROWS = 64  # bf16 x on a micro-kernel built with bf16 dot products (AVX512_BF16)


def microkernel_max_rows(scheme: str, dtype: torch.dtype) -> int | None:
    """Up to how many rows of x the micro-kernel runs (None: any number; 0: none), else torch's
    operators up to their threshold, then dequantize + BLAS.  Measured (docs/BENCHMARKS.md): the
    fp32-multiplying kernel grows like an fp32 matmul, so where bf16 matmuls are native (twice
    the fp32 rate) it keeps int8 to 16 rows and int4 to none; its bf16-dot build keeps both."""
    if dtype == torch.bfloat16 and native_bf16_matmul():
        micro = cpu_compiled.load()
        return BF16_DOT_MAX_ROWS if micro is not None and micro.bf16_dot() else NATIVE_BF16_MAX_ROWS[scheme]
    return None if scheme == "int8" else MICROKERNEL_MAX_ROWS


def unavailable_reason() -> str | None:
    names = ("_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu",
             "_convert_weight_to_int4pack_for_cpu")
    missing = [name for name in names if not hasattr(torch.ops.aten, name)]
    if missing:
        return f"this torch ({torch.__version__}) lacks the CPU operators {missing}"
    return None


def _nibble_view(t: torch.Tensor, layout: Int4Layout) -> torch.Tensor:
    """(n, *rest) with n a multiple of block_n -> (tiles, 2, half, *rest): [:, 0] the rows
    that go to the low nibbles, [:, 1] the high ones, each in byte order d."""
    half = layout.block_n // 2
    if layout.pairs:
        return t.view(-1, half, 2, *t.shape[1:]).transpose(1, 2)  # row 2d + j -> [j, d]
    return t.view(-1, 2, half, *t.shape[1:])  # row j * half + d -> [j, d]


def to_cpu_int4_layout(codes: torch.Tensor, layout: Int4Layout) -> torch.Tensor:
    """(N, K) codes, N a multiple of block_n -> (N, K / 2) uint8 in the operator's tiled order.

        tile t = rows [t * block_n, (t + 1) * block_n),  half = block_n / 2
        bytes of tile t, input k:  [ low row of d | high row of d << 4  for d in 0 .. half - 1 ]
    """
    N, K = codes.shape
    b = _nibble_view(codes.to(torch.uint8), layout)  # (tiles, low/high, d, K)
    packed = b[:, 0] | (b[:, 1] << 4)  # (tiles, d, K)
    return packed.transpose(1, 2).contiguous().view(N, K // 2)


def unpack_cpu_int4_transposed(packed: torch.Tensor, layout: Int4Layout, out: torch.Tensor) -> torch.Tensor:
    """(n, K / 2) uint8 in the operator's order, n a multiple of block_n -> the codes
    transposed, (K, n), written into `out` (any dtype, converted on the way).

    Transposed because the packing is k-major inside a tile: writing W.T copies runs of
    block_n / 2 contiguous bytes, where writing W would gather one byte every block_n / 2."""
    n, K = packed.shape[0], packed.shape[1] * 2
    b = packed.view(n // layout.block_n, K, layout.block_n // 2).transpose(0, 1)  # (k, tiles, d)
    view = _nibble_view(out.t(), layout)  # (tiles, low/high, d, K) of out's memory
    view = view.permute(3, 0, 1, 2)  # (K, tiles, low/high, d)
    view[:, :, 0].copy_(b & 0x0F)
    view[:, :, 1].copy_(b >> 4)
    return out


def learn_int4_layout(codes: torch.Tensor, packed: torch.Tensor) -> Int4Layout | None:
    """Which known packing turned `codes` (N, K) into `packed`, or None if none did."""
    for layout in KNOWN_INT4_LAYOUTS:
        if codes.shape[0] % layout.block_n == 0 and torch.equal(packed, to_cpu_int4_layout(codes, layout)):
            return layout
    return None


class CPUKernel:
    """Holds the scratch buffers (grown on demand, shared by every layer) of the many-row path.
    Invariant after `prepare`: an int8 layer holds `cpu_qweight` tiles (micro-kernel) or its
    canonical `qweight` (operators), and `scales`; an int4 layer only `cpu_qweight` (N_padded,
    K_padded / 2), `cpu_scales_and_zeros` (G, N_padded, 2) and `cpu_int4_layout` (None: unknown)."""

    name = "cpu"

    def __init__(self, microkernel: bool | None = None):
        """`microkernel`: True needs the compiled micro-kernel (an error if it cannot be built),
        False never uses it, None (the default) uses it where it builds."""
        self._scratch: dict[str, torch.Tensor] = {}  # "weights": the float weight; "codes": uint8
        self.micro = None if microkernel is False else cpu_compiled.load()
        if microkernel and self.micro is None:
            raise RuntimeError(f"the CPU micro-kernel cannot run here: {cpu_compiled.unavailable_reason()}")

    def runs_microkernel(self, layer) -> bool:
        """Whether `layer` (prepared) is computed by the micro-kernel for a few rows."""
        if self.micro is None:
            return False
        if layer.scheme == "int8":
            return True
        layout = layer.cpu_int4_layout
        return layout is not None and not layout.pairs  # it reads the vectorized packings only

    def prepare(self, layer) -> None:
        if layer.scheme == "int8":
            if self.micro is not None:  # one copy, in the micro-kernel's tiles
                layer.register_buffer("cpu_qweight", tile_int8(layer.qweight), persistent=False)
                delattr(layer, "qweight")
            return  # else the operator reads the canonical (N, K) int8 codes and (N,) scales
        num_pad = -layer.out_features % INT4_ROW_PAD
        codes = schemes.unpack_int4(layer.qweight).to(torch.int32)  # (N, K_padded)
        codes = F.pad(codes, (0, 0, 0, num_pad))  # (N_padded, K_padded)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)  # inner k tiles: 1
        zeros = layer.offsets + 8 * layer.scales  # the operator centres codes on 8
        scales_and_zeros = torch.stack([layer.scales.t(), zeros.t()], dim=-1)  # (G, N, 2)
        scales_and_zeros = F.pad(scales_and_zeros, (0, 0, 0, num_pad)).contiguous()  # (G, N_padded, 2)
        layer.cpu_int4_layout = learn_int4_layout(codes, packed)
        if layer.cpu_int4_layout is None:
            warnings.warn(f"torch's int4 CPU packing on this machine is not one this kernel knows "
                          f"({KNOWN_INT4_LAYOUTS}); decode keeps the fast operator, but inputs of "
                          f"more than {CPU_OP_MAX_ROWS['int4']} rows dequantize slowly through it", stacklevel=2)
        layer.register_buffer("cpu_qweight", packed, persistent=False)
        layer.register_buffer("cpu_scales_and_zeros", scales_and_zeros, persistent=False)
        for name in ("qweight", "scales", "offsets"):
            delattr(layer, name)  # one copy of the weight: the operator's

    def scratch(self, num_elements: int, dtype: torch.dtype, role: str = "weights") -> torch.Tensor:
        """A flat buffer of at least `num_elements` in `dtype`, reused across calls and layers
        (one per `role`)."""
        s = self._scratch.get(role)
        # An inference-mode tensor cannot be written outside inference mode (nor the reverse
        # be saved for autograd), so a change of mode takes a fresh buffer.
        if s is None or s.dtype != dtype or s.numel() < num_elements or s.is_inference() != torch.is_inference_mode_enabled():
            s = self._scratch[role] = torch.empty(num_elements, dtype=dtype)
        return s[:num_elements]

    def dequantize_transposed(self, layer, dtype: torch.dtype, rows: slice) -> torch.Tensor:
        """(K, n): an int4 layer's weight rows `rows`, transposed, in `dtype`.  The result may be
        a view of the kernel's scratch buffer: use it before the next call."""
        start, stop = rows.start, rows.stop
        scales, zeros = layer.cpu_scales_and_zeros.unbind(-1)  # (G, N_padded) each
        layout = layer.cpu_int4_layout
        if layout is None:
            return self._dequantize_through_operator(layer, dtype)[:, start:stop]
        # Whole tiles around the rows asked for: the packing is tiled by rows.
        tile_start, tile_stop = start // layout.block_n * layout.block_n, -(-stop // layout.block_n) * layout.block_n
        cols = slice(tile_start, tile_stop)
        K_padded, n = layer.padded_in_features, tile_stop - tile_start
        codes = self.scratch(K_padded * n, torch.uint8, role="codes").view(K_padded, n)
        unpack_cpu_int4_transposed(layer.cpu_qweight[cols], layout, out=codes)
        # w = (q - 8) * scale + zero = q * scale + (zero - 8 * scale): one pass (addcmul) over
        # long contiguous runs, reading uint8 codes and writing `dtype`; measured 2.7x faster
        # than converting the codes first and scaling them in place (bf16, 3072 x 1024 layer).
        scale = scales[:, cols].to(dtype).contiguous()  # (G, n)
        shift = (zeros[:, cols].float() - 8 * scales[:, cols].float()).to(dtype)  # (G, n)
        w_t = self.scratch(K_padded * n, dtype).view(K_padded, n)
        num_groups = scale.shape[0]
        torch.addcmul(shift[:, None], codes.view(num_groups, -1, n), scale[:, None], out=w_t.view(num_groups, -1, n))
        return w_t[: layer.in_features, start - tile_start : stop - tile_start]

    def _int8_codes(self, layer, rows: slice, dtype: torch.dtype) -> torch.Tensor:
        """(n, K) the int8 codes of `rows` as `dtype`, in the scratch (small integers: exact);
        from the micro-kernel's tiles a transposed view (the tiles are k-major, so writing
        W.T copies runs of 16 bytes)."""
        K, n = layer.in_features, rows.stop - rows.start
        if not hasattr(layer, "cpu_qweight"):
            w = self.scratch(n * K, dtype).view(n, K)
            return w.copy_(layer.qweight[rows])
        first, last = rows.start // INT8_TILE_ROWS, -(-rows.stop // INT8_TILE_ROWS)
        tiles = layer.cpu_qweight[first:last]  # (tiles, K, 16)
        w_t = self.scratch(K * tiles.shape[0] * INT8_TILE_ROWS, dtype).view(K, tiles.shape[0], INT8_TILE_ROWS)
        w_t.copy_(tiles.transpose(0, 1))
        start = rows.start - first * INT8_TILE_ROWS
        return w_t.view(K, -1)[:, start : start + n].t()

    def _dequantize_through_operator(self, layer, dtype: torch.dtype) -> torch.Tensor:
        """(K, N): the operator applied to the identity gives W.T, whatever its packing."""
        K_padded = layer.padded_in_features
        eye = torch.eye(K_padded, dtype=dtype)
        w_t = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, layer.cpu_qweight, layer.group_size, layer.cpu_scales_and_zeros)
        return w_t[: layer.in_features, : layer.out_features]

    def linear(self, layer, x: torch.Tensor) -> torch.Tensor:
        """x: (..., K) -> (..., N)."""
        lead, K = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, K).contiguous()  # (M, K): the operators take a matrix
        M = x2.shape[0]
        max_rows = microkernel_max_rows(layer.scheme, x2.dtype)  # 0: the operators, as without it
        if x2.dtype in MICROKERNEL_DTYPES and self.runs_microkernel(layer) and max_rows != 0:
            y = self._microkernel(layer, x2) if max_rows is None or M <= max_rows else self._many_rows(layer, x2)
        elif layer.scheme == "int8" and hasattr(layer, "cpu_qweight"):
            y = self._many_rows(layer, x2)  # the micro-kernel's tiles: no operator reads them
        elif M > CPU_OP_MAX_ROWS[layer.scheme] or x2.dtype not in OPERATOR_DTYPES:
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

    def _microkernel(self, layer, x: torch.Tensor) -> torch.Tensor:
        """(M, K) -> (M, N) in x's dtype, by cpu_microkernel.cpp."""
        if layer.scheme == "int8":
            return self.micro.int8_mm(x, layer.cpu_qweight, layer.scales)
        return self.micro.int4_mm(x, layer.cpu_qweight, layer.cpu_int4_layout.block_n,
                                  layer.cpu_scales_and_zeros, layer.group_size, layer.out_features)

    def _many_rows(self, layer, x: torch.Tensor) -> torch.Tensor:
        """(M, K) -> (M, N): dequantize a tile of rows into the scratch, one matmul per tile."""
        N, K = layer.out_features, layer.in_features
        tile = max(INT4_ROW_PAD, SCRATCH_MAX_ELEMENTS // max(K, 1) // INT4_ROW_PAD * INT4_ROW_PAD)
        if layer.scheme == "int4" and layer.cpu_int4_layout is None:
            tile = N  # an unknown packing is read whole, through the operator: no tile is cheaper
        dtype = x.dtype
        if dtype == torch.bfloat16 and not native_bf16_matmul():
            x = x.float()  # see native_bf16_matmul: fp32 BLAS, one rounding at the end
        if tile >= N:
            return self._tile_matmul(layer, x, slice(0, N)).to(dtype)
        y = torch.empty(x.shape[0], N, dtype=dtype)
        for start in range(0, N, tile):
            rows = slice(start, min(start + tile, N))
            y[:, rows] = self._tile_matmul(layer, x, rows)
        return y

    def _tile_matmul(self, layer, x: torch.Tensor, rows: slice) -> torch.Tensor:
        if layer.scheme == "int8":
            # The scale is per output row, so it multiplies the (M, n) product instead of the
            # (n, K) weight.
            return F.linear(x, self._int8_codes(layer, rows, x.dtype)) * layer.scales[rows].to(x.dtype)
        return x @ self.dequantize_transposed(layer, x.dtype, rows)  # (M, K) @ (K, n)
