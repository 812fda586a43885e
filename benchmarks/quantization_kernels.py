"""Where the CPU weight-only kernel should switch paths: one layer, every path, by row count.

The CPU kernel (`model/quantization/kernels/cpu.py`) runs torch's weight-only operators for a few
rows and dequantizes into a scratch buffer for one bf16 matmul beyond; `CPU_OP_MAX_ROWS` is
where.  This script measures both paths of each scheme, and bf16 `F.linear` beside them, on the
Qwen3-0.6B projection shapes (random weights, bf16 activations), at each row count:

    rows   bf16 F.linear   int8 operator   int8 dequantize+matmul   int4 operator   int4 ...
    1      ...

Every repeat times all the paths one after another in a rotating order, so a machine whose load
changes moves all of them; a cell is the median of the repeats [min-max], summed over the
layer shapes of one decoder layer (q, k, v, o, gate, up, down).  The last lines name, per
scheme, the first row count where dequantize+matmul beats the operator (the threshold).

    python benchmarks/quantization_kernels.py                  # a minute or two on 2 cores
    python benchmarks/quantization_kernels.py --rows 1,8,16 --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import add_threads_option, apply_threads_option
from torch import nn

from minilm_engine.model.quantization import QuantizationConfig
from minilm_engine.model.quantization.kernels import cpu, cpu_compiled
from minilm_engine.model.quantization.linear import QuantizedLinear

# (out, in) of Qwen3-0.6B's projections: q, k, v, o, gate, up, down
LAYER_SHAPES = [(2048, 1024), (1024, 1024), (1024, 1024), (1024, 2048), (3072, 1024), (3072, 1024), (1024, 3072)]
SCHEMES = {"int8": QuantizationConfig("int8", group_size=None, scale_dtype="bfloat16"),
           "int4": QuantizationConfig("int4", group_size=128, scale_dtype="bfloat16")}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,2,4,8,12,16,24,32,48,64,96,128,512")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3, help="calls per timing (their mean is one repeat)")
    add_threads_option(parser, default=2, why="the engine's decode default on a 2-core machine")
    return parser.parse_args(argv)


def make_layers(scheme: str, microkernel: bool) -> tuple[list[QuantizedLinear], cpu.CPUKernel]:
    kernel = cpu.CPUKernel(microkernel=microkernel)
    layers = []
    for N, K in LAYER_SHAPES:
        layer = QuantizedLinear.from_linear(nn.Linear(K, N, bias=False).bfloat16(), SCHEMES[scheme])
        kernel.prepare(layer)
        layer.kernel = kernel
        layers.append(layer)
    return layers, kernel


def operator(layer, x):
    """The operator path whatever the row count (the kernel's `linear` below its threshold)."""
    if layer.scheme == "int8":
        return torch.ops.aten._weight_int8pack_mm(x, layer.qweight, layer.scales)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, layer.cpu_qweight, layer.group_size,
                                                      layer.cpu_scales_and_zeros)


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_threads_option(args)
    torch.manual_seed(0)
    bf16 = [torch.randn(N, K, dtype=torch.bfloat16) for N, K in LAYER_SHAPES]
    micro = cpu_compiled.load() is not None
    if not micro:
        print(f"(no micro-kernel: {cpu_compiled.unavailable_reason()})")
    paths = {"bf16": lambda i, x: F.linear(x, bf16[i])}
    for scheme in SCHEMES:
        layers, kernel = make_layers(scheme, microkernel=False)  # the canonical int8 layout: the operator reads it
        paths[f"{scheme} operator"] = lambda i, x, layers=layers: operator(layers[i], x)
        paths[f"{scheme} dequant"] = lambda i, x, layers=layers, kernel=kernel: kernel._many_rows(layers[i], x)
        if micro:
            layers, kernel = make_layers(scheme, microkernel=True)
            paths[f"{scheme} micro"] = lambda i, x, layers=layers, kernel=kernel: kernel._microkernel(layers[i], x)
    names = list(paths)
    rows = [int(r) for r in args.rows.split(",")]
    print(f"one Qwen3-0.6B decoder layer's projections, bf16 activations, {torch.get_num_threads()} threads: "
          f"ms, median [min-max] of {args.repeats} rotating repeats")
    print(f"{'rows':>5}" + "".join(f"{n:>20}" for n in names))
    medians = {}
    for M in rows:
        xs = {K: torch.randn(M, K, dtype=torch.bfloat16) for K in {K for _, K in LAYER_SHAPES}}
        runs = {n: [] for n in names}
        for n in names:  # warm-up (oneDNN builds a primitive per shape)
            for i, (_, K) in enumerate(LAYER_SHAPES):
                paths[n](i, xs[K])
        for r in range(args.repeats):
            for n in names[r % len(names):] + names[: r % len(names)]:
                start = time.perf_counter()
                for _ in range(args.calls):
                    for i, (_, K) in enumerate(LAYER_SHAPES):
                        paths[n](i, xs[K])
                runs[n].append((time.perf_counter() - start) / args.calls * 1e3)
        medians[M] = {n: statistics.median(v) for n, v in runs.items()}
        print(f"{M:>5}" + "".join(f"{statistics.median(v):7.2f} [{min(v):.2f}-{max(v):.2f}]".rjust(20)
                                  for v in runs.values()), flush=True)
    for scheme in SCHEMES:
        wins = [M for M in rows if medians[M][f"{scheme} dequant"] < medians[M][f"{scheme} operator"]]
        print(f"{scheme}: dequantize+matmul beats the operator from {wins[0] if wins else 'no measured'} rows "
              f"(CPU_OP_MAX_ROWS now {cpu.CPU_OP_MAX_ROWS[scheme]})")
        if micro:
            wins = [M for M in rows if medians[M][f"{scheme} dequant"] < medians[M][f"{scheme} micro"]]
            print(f"{scheme}: dequantize+matmul beats the micro-kernel from {wins[0] if wins else 'no measured'} rows "
                  f"(MICROKERNEL_MAX_ROWS now {cpu.MICROKERNEL_MAX_ROWS})")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
