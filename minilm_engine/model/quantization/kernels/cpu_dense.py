"""fp32 / bf16 matmuls for decode-shaped steps: the compiled micro-kernel below a crossover in
rows measured on this machine, torch's matmul (oneDNN / MKL) above it, over one weight.

Contract: `DenseMatmul(weight, bias, micro)(x)` is `F.linear(x, weight, bias)` (to float
rounding) for x (..., K) and a plain (N, K) fp32 or bf16 weight, the only copy.  The crossover
is measured the first time a (shape, dtype, threads) is met and kept for the process: timings
pick the path, never the results.  `MINILM_DENSE_CROSSOVER_ROWS=R` fixes it at R rows (the tests
set it, so which path runs never depends on how busy the machine was).  Why: a decode step's
floor is one read of the weights, which the kernel reaches where torch's fp32 matmul took 2.4x
longer at 2 rows than at 1 (2-core AVX2); prefill-sized steps are compute bound and keep torch.
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
