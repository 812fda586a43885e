"""Batch-1 decode, the readable decoder against the fused one, on a GPU (or a CPU).

    python benchmarks/fused_step.py                    # CUDA when there is one: Qwen3-0.6B shape, bf16
    python benchmarks/fused_step.py --quick --device cpu

One process builds a random Qwen3-0.6B checkpoint (`--quick`: a tiny one) and two engines on it,
`model_backend="reference"` and `"fused"` (on a GPU: Triton kernels for the norms, q/k norm +
rotary and SwiGLU, q/k/v and gate/up one cuBLAS matmul each; on a CPU: the micro-kernel), then
decodes one request greedily on each in turn, `--repeats` times, alternating.  It prints each
one's median time per step (with the range), the ratio per repeat (median and range), whether
the greedy tokens are equal, and, from `torch.profiler`, the kernels a step launches (on a CPU:
the torch ops it dispatches) and their device time.

Why: on an H200 a batch-1 step of the readable decoder was ~1,630 kernels of ~2.4 us, 4.4 ms
a step where reading the weights once takes 0.29 ms (docs/BENCHMARKS.md, "Performance on a
GPU"): the launches, not the bytes, set the time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from common import add_threads_option, apply_threads_option
from torch.profiler import ProfilerActivity, profile
from throughput import build_checkpoint, hf_config

from minilm_engine import LLM, SamplingParams

BACKENDS = ("reference", "fused")


def kernels_per_step(llm: LLM, prompt: dict, params: SamplingParams, device: torch.device) -> tuple[float, float]:
    """(kernels a step, their device milliseconds a step) over one generation; on a CPU, the
    torch ops dispatched (leaf ops only, each counted once) and None for the time."""
    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        llm.generate([prompt], params, use_tqdm=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    steps = params.max_tokens
    if device.type == "cuda":
        events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        return sum(e.count for e in events) / steps, sum(e.self_device_time_total for e in events) / steps / 1e3
    # A CPU op that calls no other op is one dispatch of work (aten::linear calls aten::addmm...).
    leaves = [e for e in prof.events() if e.name.startswith("aten::") and not e.cpu_children]
    return len(leaves) / steps, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a tiny model (seconds; for the tests)")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens per generation (the steps timed)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here")
    add_threads_option(parser, default=2)
    args = parser.parse_args()
    apply_threads_option(args)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    folder = Path(tempfile.mkdtemp(prefix="fused_step_"))
    del_model = build_checkpoint(hf_config(args.quick), folder, device, dtype, seed=0)
    del del_model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    llms = {b: LLM(str(folder), device=str(device), dtype=dtype, model_backend=b, max_num_seqs=4,
                   num_kv_blocks=64, record_trace=False) for b in BACKENDS}
    ran = {b: llm.model_backend for b, llm in llms.items()}
    if ran["fused"] != "fused":
        print(f"the fused path does not run here (it fell back: {ran}); nothing to compare")
        return 2
    prompt = {"prompt_token_ids": list(range(100, 164))}
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    tokens = {b: llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids for b, llm in llms.items()}
    ms: dict[str, list[float]] = {b: [] for b in BACKENDS}
    for _ in range(args.repeats):  # alternating, so a slow spell of the machine hits both
        for b, llm in llms.items():
            (out,) = llm.generate([prompt], params, use_tqdm=False)
            ms[b].append(1e3 * out.metrics.tpot)
    ratios = [r / f for r, f in zip(ms["reference"], ms["fused"])]
    first_difference = next((i for i, (a, b) in enumerate(zip(tokens["reference"], tokens["fused"])) if a != b), None)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "dtype": str(dtype).removeprefix("torch."), "model": "tiny (--quick)" if args.quick else "Qwen3-0.6B shape",
              "tokens": args.tokens, "same_tokens": first_difference is None, "first_difference": first_difference,
              "ms_per_step": ms, "speedup_median": statistics.median(ratios),
              "speedup_range": [min(ratios), max(ratios)]}
    unit = "kernels" if device.type == "cuda" else "torch ops"
    print(f"batch-1 decode, {result['model']}, {result['dtype']} on {result['device']}, {args.tokens} tokens, "
          f"{args.repeats} alternating repeats")
    for b in BACKENDS:
        count, device_ms = kernels_per_step(llms[b], prompt, params, device)
        result[f"{b}_per_step"] = {unit: count, "device_ms": device_ms}
        median = statistics.median(ms[b])
        extra = "" if device_ms is None else f", their device time {device_ms:.3f} ms"
        print(f"  {b:<9}  {median:8.3f} ms a step ({min(ms[b]):.3f}-{max(ms[b]):.3f}), "
              f"{1e3 / median:7.1f} tok/s; {count:7.0f} {unit} a step{extra}")
    print(f"  fused / reference: {result['speedup_median']:.2f}x faster "
          f"[{result['speedup_range'][0]:.2f}-{result['speedup_range'][1]:.2f}]; greedy tokens "
          + ("equal" if first_difference is None else f"differ from token {first_difference} (bf16 rounding)"))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
