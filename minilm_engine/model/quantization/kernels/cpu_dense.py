"""fp32 / bf16 matmuls for decode-shaped steps over one copy of each weight, on the compiled
micro-kernel (cpu_microkernel.cpp).

Contract: `PackedMatmul(weight, bias, micro)(x)` and `DenseMatmul(weight, bias, micro)(x)` are
`F.linear(x, weight, bias)` (to float rounding) for x (..., K).
- bf16 (`PackedMatmul`): the weight is repacked once into pairs of inputs in tiles of 16 rows
  (`pack_pairs`, the only copy), and every call runs the kernel's `packed_mm`.  Why: one-row
  steps read that layout at about twice the speed of the plain (N, K) matrix, and from 1 to 128
  rows it matched or beat oneDNN's bf16 matmul (0.64-1.0x its time; 1.1x at 512-2,048 rows, a
  prefill's share: one layout cannot be both).  `packed_rows` reads table rows back from it, so
  a tied embedding and LM head stay one table.
- fp32 (`DenseMatmul`): the plain (N, K) matrix, the kernel's `dense_mm` below a crossover in
  rows measured the first time a (shape, dtype, threads) is met and kept for the process
  (timings pick the path, never the results), torch's matmul (MKL) above it.
  `MINILM_DENSE_CROSSOVER_ROWS=R` fixes it at R rows (the tests set it, so which path runs never
  depends on how busy the machine was).  Why: a decode step's floor is one read of the weights,
  which the kernel reaches where torch's fp32 matmul took 2.4x longer at 2 rows than at 1 (2-core
  AVX2); prefill-sized steps are compute bound and keep torch.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

CROSSOVER_ROWS = (1, 2, 4, 8, 16, 32, 64)  # row counts timed when a shape is first met
CROSSOVER_ENV = "MINILM_DENSE_CROSSOVER_ROWS"  # a fixed crossover instead of a measured one
NUM_TIMED_CALLS = 5  # per path and row count, alternated; the fastest of each is compared

_crossovers: dict[tuple[int, int, torch.dtype, int], int] = {}  # (N, K, dtype, threads) -> rows


def _seconds(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


@torch.inference_mode()
def measure_crossover(micro, weight: torch.Tensor, rows: tuple[int, ...] = CROSSOVER_ROWS) -> int:
    """The most rows (one of `rows`) up to which the micro-kernel was at least as fast as
    `F.linear` on `weight`'s shape, timed here and now: the last count it won before torch won
    twice in a row (one loss can be a busy moment); 0 when torch won the first two."""
    best, losses = 0, 0
    for num_rows in rows:
        x = torch.randn(num_rows, weight.shape[1]).to(weight.dtype)
        micro.dense_mm(x, weight, None), F.linear(x, weight)  # warm: first touch, oneDNN's cache
        t_kernel = t_torch = float("inf")
        # Alternated, so a busy moment hits both alike; the fastest call, because on a shared
        # machine other work only ever adds time.
        for _ in range(NUM_TIMED_CALLS):
            t_kernel = min(t_kernel, _seconds(micro.dense_mm, x, weight, None))
            t_torch = min(t_torch, _seconds(F.linear, x, weight))
        if t_kernel > t_torch:
            losses += 1
            if losses == 2:
                break
            continue
        best, losses = num_rows, 0
    return best


def crossover_rows(micro, weight: torch.Tensor) -> int:
    """`measure_crossover` for this shape, dtype and thread count, measured once per process
    (or `$MINILM_DENSE_CROSSOVER_ROWS`, when set)."""
    fixed = os.environ.get(CROSSOVER_ENV)
    if fixed is not None:
        if not fixed.isdigit():
            raise ValueError(f"{CROSSOVER_ENV} must be a number of rows (0 or more), got {fixed!r}")
        return int(fixed)
    key = (weight.shape[0], weight.shape[1], weight.dtype, torch.get_num_threads())
    if key not in _crossovers:
        _crossovers[key] = measure_crossover(micro, weight)
    return _crossovers[key]


def measured_crossovers() -> dict[tuple[int, int, torch.dtype, int], int]:
    """Every crossover measured so far: (N, K, dtype, threads) -> the most rows the kernel runs."""
    return dict(_crossovers)


class DenseMatmul:
    """y = x W^T + b over one plain (N, K) weight: the micro-kernel for at most `max_rows` rows of
    x, `F.linear` for more (either adds the bias before rounding once).  `max_rows` is None until
    the first call measures it (or a caller sets it, as the tests do to pick a path)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, micro):
        self.weight = weight  # (N, K), contiguous: the one copy
        self.bias = bias  # (N,) or None
        self.micro = micro
        self.max_rows: int | None = None

    def runs_kernel(self, num_rows: int) -> bool:
        """Whether a call with `num_rows` rows of x runs the micro-kernel (measuring the crossover
        on the first call)."""
        if self.micro is None:
            return False
        if self.max_rows is None:
            self.max_rows = crossover_rows(self.micro, self.weight)
        return num_rows <= self.max_rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        K = x.shape[-1]
        num_rows = x.numel() // K
        if not self.runs_kernel(num_rows):
            return F.linear(x, self.weight, self.bias)
        y = self.micro.dense_mm(x.reshape(num_rows, K).contiguous(), self.weight, self.bias)  # (rows, N)
        return y.view(*x.shape[:-1], self.weight.shape[0])


PAIR_TILE = 16  # output rows per tile of the pair layout (the kernel's PT)


def pack_pairs(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) -> (ceil(N / 16), ceil(K / 2), 16, 2): in tile t, pair p holds (w[16t + j, 2p],
    w[16t + j, 2p + 1]) for the tile's rows j side by side; zeros past row N and input K."""
    N, K = weight.shape
    rows, cols = -(-N // PAIR_TILE) * PAIR_TILE, K + K % 2
    padded = weight.new_zeros(rows, cols)
    padded[:N, :K] = weight
    return padded.view(rows // PAIR_TILE, PAIR_TILE, cols // 2, 2).permute(0, 2, 1, 3).contiguous()


def packed_rows(packed: torch.Tensor, ids: torch.Tensor, K: int) -> torch.Tensor:
    """Rows `ids` (...) of the (N, K) matrix `packed` was made from -> (..., K): row n is lane
    n % 16 of tile n // 16, in every pair."""
    rows = packed[ids // PAIR_TILE, :, ids % PAIR_TILE, :]  # (..., ceil(K / 2), 2)
    return rows.reshape(*ids.shape, -1)[..., :K]


class PackedMatmul:
    """y = x W^T + b with W (N, K) bf16 packed by `pack_pairs` (the one copy; the plain weight
    can be dropped), on the micro-kernel's `packed_mm` at every row count.  `num_weight_bytes`
    is W's own size, padding left out."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, micro):
        self.out_features, self.in_features = weight.shape
        self.packed = pack_pairs(weight)
        self.bias = bias  # (N,) or None
        self.micro = micro
        self.num_weight_bytes = weight.numel() * weight.element_size()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of W (an embedding lookup on a tied table) -> (..., K)."""
        return packed_rows(self.packed, ids, self.in_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        K = x.shape[-1]
        num_rows = x.numel() // K
        y = self.micro.packed_mm(x.reshape(num_rows, K).contiguous(), self.packed, self.out_features, self.bias)
        return y.view(*x.shape[:-1], self.out_features)  # (..., N)
