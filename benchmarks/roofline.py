"""A decode step against this machine's roofline, with and without the CPU micro-kernel.

Measures the read bandwidth (a large read-only reduction) and the fp32 matmul FLOP/s, then times
the engine's decode steps (`LLM.engine.step` with every request decoding, as issue 32 measured
them: scheduling, paged attention and sampling included) of a Qwen3-0.6B-shaped model
(`course/known_configs.py`, random weights) at each batch size and precision, twice: with the micro-kernel (the default: fp32 / bf16 on the fused
CPU path, weights packed for `packed_mm`; int8 / int4 weight-only, `int8_mm` / `int4_mm`, the
head packed) and without it (torch's matmuls or weight-only operators, the
path before it).  int8 / int4 run with bf16 activations where this CPU multiplies bf16
natively, else fp32 (`real_shape.default_dtype`), and keep the head in that dtype.  The two
models alternate in every round, so a busy moment on a shared machine hits both.
The functions are the course's (`course/experiments/roofline.py`), which chapter 01 draws:

    predicted(B) = max(weight bytes / read bandwidth, 2 * matmul params * B / matmul FLOP/s)

A cell is the median of the rounds' median steps, with the rounds' spread [min-max], and the
ratio to the prediction in brackets (1.0x: the step is the roofline).  Each precision ends with
its ridge B*, and with the same model on the datasheet constants of an H100 and a T4
(`roofline.DATASHEETS`): predicted steps labelled modelled, with their source; nothing there is
measured here.  Where a quantized precision and bf16 both ran, a last table gives the quantized
step over the bf16 step at each B (the issue's goal: at most 1.0x up to B = 32).  Each precision
also times one forward over K + 1 = 5 tokens against a decode step at batch 1 (a verification
in speculative decoding, `speculative.time_verify_forward_repeats`), and splits each step of
B <= 16 into its matmuls (every projection and the head, called again on the inputs a real step
gave them, right after that step: `time_step_split`) and the rest, with the matmuls' read rate
and FLOP/s against the roofline's.  The run ends with issue 32's goals, met or the worst cell
that misses with its split: what limits it, measured.

    python benchmarks/roofline.py --threads 2             # full size: a few minutes
    python benchmarks/roofline.py --quick                 # a tiny config: seconds (the smoke test)
    python benchmarks/roofline.py --precisions fp32,bf16,int8,int4 --batch-sizes 1,4,16 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from common import QUICK_OVERRIDES, QWEN3_0_6B, add_threads_option, apply_threads_option

from minilm_engine import LLM
from minilm_engine.course.experiments.batching import hardware_summary, time_engine_decode_step
from minilm_engine.course.experiments.quantization import write_random_qwen3
from minilm_engine.course.experiments.real_shape import default_dtype
from minilm_engine.course.experiments.roofline import (
    DATASHEETS,
    Roofline,
    StepCost,
    measure_roofline,
    step_cost,
    time_steps,
)
from minilm_engine.course.experiments.speculative import time_verify_forward_repeats
from minilm_engine.course.known_configs import KNOWN_CONFIGS
from minilm_engine.model.fused import FusedLinear, MatVecHead, fuse_for_cpu
from minilm_engine.model.quantization.kernels import cpu_compiled
from minilm_engine.model.quantization.kernels.cpu import CPUKernel
from minilm_engine.model.quantization.linear import QuantizedLinear

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
SCHEMES = ("int8", "int4")
GOAL_ROOFLINE = 1.25  # issue 32: every decode step within 1.25x of the roofline up to B = 16
GOAL_VERIFY = 1.25  # ... and scoring K + 1 = 5 tokens at most 1.25x one decode step at batch 1
VERIFY_TOKENS = 5


def load_pair(folder: Path, precision: str) -> dict:
    """The engine with the micro-kernel ("kernel") and without it ("torch"), recording their
    traces (a step's duration is read from its record)."""
    args = dict(record_trace=True, max_num_seqs=64)
    if precision in DTYPES:
        with_kernel = LLM(folder, model_backend="fused", dtype=DTYPES[precision], **args)
        without = LLM(folder, model_backend="reference", dtype=DTYPES[precision], **args)
        fuse_for_cpu(without.model, microkernel=False)
        return {"kernel": with_kernel, "torch": without}
    args.update(dtype=default_dtype("cpu"), quantization=precision)
    with_kernel = LLM(folder, quantization_config={"kernel": "cpu"}, **args)
    without = LLM(folder, quantization_config={"kernel": "reference"}, **args)
    operators = CPUKernel(microkernel=False)  # torch's weight-only operators
    for module in without.model.modules():
        if isinstance(module, QuantizedLinear):
            operators.prepare(module)
            module.kernel = operators
    return {"kernel": with_kernel, "torch": without}


MATMUL_MODULES = (FusedLinear, MatVecHead, QuantizedLinear, nn.Linear)  # a step's matmuls, each one call


def time_step_split(llm, batch_size: int, num_repeats: int = 5) -> dict:
    """An engine decode step of `batch_size` requests split into its matmuls and the rest: hooks
    record each projection's and the head's input on a real step; each repeat then times one
    step (`time_engine_decode_step`) and, right after, one pass calling every matmul again on
    its recorded input.  Medians (seconds) of the step, the matmuls and the per-repeat
    difference, the rest (attention, norms, sampling, scheduling, Python): paired, so a busy
    moment hits both sides of it."""
    inputs: dict[nn.Module, torch.Tensor] = {}

    def record(module, args):
        inputs[module] = args[0].detach().clone()  # the last call wins: the decode step's rows

    model = llm.model
    handles = [m.register_forward_pre_hook(record) for m in model.modules() if isinstance(m, MATMUL_MODULES)]
    try:
        time_engine_decode_step(llm, batch_size, num_steps=1)
    finally:
        for handle in handles:
            handle.remove()
    steps, matmuls = [], []
    for _ in range(num_repeats):
        steps.append(time_engine_decode_step(llm, batch_size, num_steps=2).step_s)
        start = time.perf_counter()
        for module, x in inputs.items():
            module(x)
        matmuls.append(time.perf_counter() - start)
    return {"step_s": statistics.median(steps), "matmul_s": statistics.median(matmuls),
            "rest_s": statistics.median(s - m for s, m in zip(steps, matmuls))}


def cell(times, predicted_s: float) -> str:
    ms = [t * 1e3 for t in times.step_s]
    return f"{times.median_s * 1e3:8.1f} ms [{min(ms):.1f}-{max(ms):.1f}] ({times.median_s / predicted_s:.1f}x)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny config, one round (the smoke test)")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16, int8, int4")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="decode steps timed per cell and round")
    parser.add_argument("--num-layers", type=int, default=None, help="fewer layers (same shapes per layer)")
    parser.add_argument("--json", type=Path, default=None)
    add_threads_option(parser, default=2, why="the issue's machine has 2 cores")
    args = parser.parse_args()
    apply_threads_option(args)
    precisions = [p for p in args.precisions.split(",") if p]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    num_rounds = 1 if args.quick else args.rounds

    roofline = measure_roofline(num_bytes=1 << (24 if args.quick else 28), matmul_n=256 if args.quick else 2048)
    micro = cpu_compiled.load()
    print(hardware_summary())
    print(f"read bandwidth {roofline.read_bandwidth / 1e9:.1f} GB/s, fp32 matmul {roofline.matmul_flops / 1e9:.0f} GFLOP/s; "
          f"micro-kernel: {'built' if micro is not None else cpu_compiled.unavailable_reason()}")
    results = {"hardware": hardware_summary(), "read_bandwidth": roofline.read_bandwidth,
               "matmul_flops": roofline.matmul_flops, "rows": [], "ridge": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "bf16"
        fields = {k: v for k, v in KNOWN_CONFIGS[QWEN3_0_6B].items() if k not in ("architectures", "torch_dtype")}
        fields.update(QUICK_OVERRIDES if args.quick else {})
        if args.num_layers:
            fields["num_hidden_layers"] = args.num_layers
        write_random_qwen3(folder, **fields)
        print(f"\n{QWEN3_0_6B} shape{' (tiny, --quick)' if args.quick else ''}, {fields['num_hidden_layers']} layers, "
              f"random weights; {num_rounds} round(s) x {args.steps} steps per cell\n")
        print(f"{'precision':>9} {'B':>3} {'predicted':>10}   {'with the micro-kernel':<34} {'without (torch, before)':<34} speedup")
        for precision in precisions:
            models = load_pair(folder, precision)
            cost = step_cost(models["kernel"].model)
            ridge = roofline.ridge(cost)
            results["ridge"][precision] = ridge
            with torch.inference_mode():
                times = time_steps(models, batch_sizes, num_rounds=num_rounds, num_steps=args.steps)
            by = {(t.name, t.batch_size): t for t in times}
            for b in batch_sizes:
                predicted = roofline.step_s(cost, b)
                kernel, plain = by["kernel", b], by["torch", b]
                print(f"{precision:>9} {b:>3} {predicted * 1e3:7.1f} ms   {cell(kernel, predicted):<34} "
                      f"{cell(plain, predicted):<34} {plain.median_s / kernel.median_s:.2f}x")
                results["rows"].append({"precision": precision, "batch_size": b, "predicted_s": predicted,
                                        "weight_bytes": cost.weight_bytes, "matmul_params": cost.num_matmul_params,
                                        "kernel_s": list(kernel.step_s), "torch_s": list(plain.step_s)})
            print(f"{precision:>9} ridge B* = {ridge:.0f} (weights {cost.weight_bytes / 1e6:.0f} MB, "
                  f"{cost.num_matmul_params / 1e6:.0f}M matmul params)")
            for sheet in DATASHEETS.values():  # the same step on a datasheet's ceilings: modelled
                steps = ", ".join(f"B={b} {sheet.roofline.step_s(cost, b) * 1e3:.2f} ms" for b in batch_sizes)
                print(f"{precision:>9} modelled, {sheet.name} ({sheet.source}): {steps}; "
                      f"ridge B* = {sheet.roofline.ridge(cost):.0f}")
                results.setdefault("modelled", []).append(
                    {"precision": precision, "device": sheet.name, "source": sheet.source,
                     "ridge": sheet.roofline.ridge(cost),
                     "step_s": {b: sheet.roofline.step_s(cost, b) for b in batch_sizes}})
            with torch.inference_mode():  # one forward over K + 1 tokens against a decode step
                verify = time_verify_forward_repeats(models["kernel"].model, [1, VERIFY_TOKENS], context_len=128,
                                                     num_repeats=2 if args.quick else 8)
            ratios = [v / d for v, d in zip(verify[VERIFY_TOKENS], verify[1])]  # paired, repeat by repeat
            results.setdefault("verify_over_step", {})[precision] = ratios
            print(f"{precision:>9} batch 1: scoring {VERIFY_TOKENS} tokens / one decode step "
                  f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]")
            with torch.inference_mode():
                splits = {b: time_step_split(models["kernel"], b, num_repeats=2 if args.quick else 5)
                          for b in batch_sizes if b <= 16}
            results.setdefault("step_split", {})[precision] = splits
            print(f"{precision:>9} the step split (with the micro-kernel): " + "; ".join(
                f"B={b} {split(parts, cost, b, roofline)}" for b, parts in splits.items()))
            del models
            gc.collect()
    quantized_over_bf16(results["rows"], batch_sizes)
    print_goals(results, batch_sizes)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def split(parts: dict, cost, batch_size: int, roofline) -> str:
    """A step's `time_step_split`: the matmuls' read rate and FLOP/s over the roofline's, and the rest."""
    matmul_s = parts["matmul_s"]
    read = cost.weight_bytes / matmul_s
    flops = 2 * cost.num_matmul_params * batch_size / matmul_s
    return (f"{parts['step_s'] * 1e3:.1f} ms = matmuls {matmul_s * 1e3:.1f} ms ({read / 1e9:.1f} GB/s = "
            f"{read / roofline.read_bandwidth:.2f}x the read bandwidth, {flops / 1e9:.0f} GFLOP/s = "
            f"{flops / roofline.matmul_flops:.2f}x) + the rest {parts['rest_s'] * 1e3:.1f} ms")


def quantized_over_bf16(rows: list[dict], batch_sizes: list[int]) -> None:
    """The quantized step over the bf16 step (both with the micro-kernel) at each B, where both ran."""
    median = {(r["precision"], r["batch_size"]): statistics.median(r["kernel_s"]) for r in rows}
    quantized = [p for p in SCHEMES if (p, batch_sizes[0]) in median]
    if "bf16" not in {p for p, _ in median} or not quantized:
        return
    print("\nquantized step / bf16 step (with the micro-kernel; the goal: at most 1.00x up to B = 32)")
    print(f"{'B':>3} " + " ".join(f"{p:>8}" for p in quantized))
    for b in batch_sizes:
        print(f"{b:>3} " + " ".join(f"{median[p, b] / median['bf16', b]:7.2f}x" for p in quantized))


def print_goals(results: dict, batch_sizes: list[int]) -> None:
    """Issue 32's goals on this run: met, or the worst cell that misses."""
    print("\ngoals (medians of this run)")
    by = {}
    for r in results["rows"]:
        by.setdefault(r["precision"], []).append(r)
    for precision, rows in by.items():
        ratios = {r["batch_size"]: statistics.median(r["kernel_s"]) / r["predicted_s"] for r in rows
                  if r["batch_size"] <= 16}
        if ratios:
            worst = max(ratios, key=ratios.get)
            verdict = "met" if ratios[worst] <= GOAL_ROOFLINE else f"missed, worst B = {worst}"
            print(f"  {precision}: step / roofline at B <= 16 at most {ratios[worst]:.2f}x "
                  f"(goal {GOAL_ROOFLINE}x): {verdict}")
            parts = results.get("step_split", {}).get(precision, {}).get(worst)
            if ratios[worst] > GOAL_ROOFLINE and parts is not None:
                row = next(r for r in rows if r["batch_size"] == worst)
                cost = StepCost(row["weight_bytes"], row["matmul_params"])
                ceilings = Roofline(results["read_bandwidth"], results["matmul_flops"])
                print(f"    what limits it at B = {worst}: a step {split(parts, cost, worst, ceilings)}")
    for precision, ratios in results.get("verify_over_step", {}).items():
        median = statistics.median(ratios)
        print(f"  {precision}: batch-1 verification of {VERIFY_TOKENS} tokens / decode step {median:.2f}x "
              f"(goal {GOAL_VERIFY}x): {'met' if median <= GOAL_VERIFY else 'missed'}")


if __name__ == "__main__":
    main()
