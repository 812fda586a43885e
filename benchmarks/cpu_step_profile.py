"""Where one batch-1 CPU decode step goes: matmul, attention, norms, rotary, sampling, the rest.

Issue 22 asks, for each goal missed, what limits it, measured.  This script loads the engine on
a random Qwen3-0.6B-shaped checkpoint (as `cpu_decode.py` does), puts one request through its
prefill, then runs `--steps` decode steps under `torch.profiler` with every leaf of the step
wrapped in a named `record_function` range:

    matmul     every projection and the LM head (FusedLinear / nn.Linear / quantized linears / MatVecHead)
    attention  the paged KV write and attention (`PagedAttention.attend`)
    norms      every RMSNorm (per layer, q/k norms, the final one; the micro-kernel's `rms_norm`)
    rotary     `apply_rotary` on q and k, or the micro-kernel's `norm_rotary_` (q/k norm + rotary)
    sampling   `sampler.sample` (greedy: an argmax)
    other      the step's wall time minus all of the above: the SwiGLU's silu * up, the residual
               adds, views, the scheduler, building the step's metadata, and Python between ops

A category is the inclusive CPU time of its ranges, per step (the ranges never nest: each wraps
a leaf); `unprofiled_ms` times the same number of steps just before, without the profiler.  The wrappers add a few microseconds per range (~10 ranges a layer), so "other" is a
slight overestimate of what Python costs without them.

    python benchmarks/cpu_step_profile.py --threads 2                          # fused, bf16
    python benchmarks/cpu_step_profile.py --backend reference --quantization int8
    python benchmarks/cpu_step_profile.py --quick --json split.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from common import QUICK_OVERRIDES, QWEN3_0_6B, add_threads_option, apply_threads_option
from torch.profiler import ProfilerActivity, profile, record_function

from minilm_engine import LLM, SamplingParams
from minilm_engine.model.attention import context as attention_context
from minilm_engine.worker import model_runner
from minilm_engine.course.experiments.quantization import write_random_qwen3
from minilm_engine.model import decoder, fused
from minilm_engine.model.quantization.linear import QuantizedLinear
from minilm_engine.course.known_configs import KNOWN_CONFIGS

CATEGORIES = ("matmul", "attention", "norms", "rotary", "sampling")


def timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with record_function(f"step::{name}"):
            return fn(*args, **kwargs)
    return wrapper


def instrument(llm: LLM) -> None:
    """Wrap every leaf of the decode step in a `record_function` range named after its category."""
    for module in llm.model.modules():
        if isinstance(module, (decoder.RMSNorm, fused.HeadwiseRMSNorm, fused.KernelRMSNorm)):
            module.forward = timed("norms", module.forward)
        elif isinstance(module, fused.FusedAttention) and module.ops is not None:
            # q and k's norm and rotation, one kernel call: counted as rotary
            module.ops = SimpleNamespace(norm_rotary_=timed("rotary", module.ops.norm_rotary_))
        elif isinstance(module, (torch.nn.Linear, fused.FusedLinear, fused.MatVecHead, QuantizedLinear)):
            module.forward = timed("matmul", module.forward)  # (a QuantizedGroup only calls these)
    attention_context.PagedAttention.attend = timed("attention", attention_context.PagedAttention.attend)
    model_runner.sample_requests = timed("sampling", model_runner.sample_requests)
    decoder.apply_rotary = timed("rotary", decoder.apply_rotary)
    fused.apply_rotary = timed("rotary", fused.apply_rotary)


def profile_steps(llm: LLM, num_steps: int, prompt_tokens: int) -> dict:
    """ms per step of each category and of the whole step, over `num_steps` decode steps."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=2 * num_steps + 2, ignore_eos=True)
    vocab = llm.config.vocab_size
    engine.add_request("profiled", {"prompt_token_ids": [(31 * j) % (vocab - 10) + 10 for j in range(prompt_tokens)]},
                       params)
    engine.step()  # the prefill, not profiled
    engine.step()  # one decode step, to warm up
    start = time.perf_counter()
    for _ in range(num_steps):  # the same steps without the profiler (which slows small ops)
        engine.step()
    plain_ms = (time.perf_counter() - start) * 1e3 / num_steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(num_steps):
            engine.step()
        wall_ms = (time.perf_counter() - start) * 1e3 / num_steps
    while engine.has_unfinished_requests():
        engine.step()
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for event in prof.key_averages():
        if event.key.startswith("step::"):
            totals[event.key.removeprefix("step::")] += event.cpu_time_total / 1e3 / num_steps
    totals["other"] = wall_ms - sum(totals.values())
    return {"unprofiled_ms": plain_ms, "step_ms": wall_ms, **totals}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny config (seconds)")
    parser.add_argument("--backend", default="fused", choices=fused.MODEL_BACKENDS)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention-backend", default="auto", help="auto (the CPU backend), torch, cpu")
    parser.add_argument("--quantization", default=None, help="int8 / int4 (quantized projections)")
    parser.add_argument("--steps", type=int, default=8, help="profiled decode steps per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--checkpoint", default=None, help="a checkpoint folder (default: a random Qwen3-0.6B)")
    parser.add_argument("--json", default=None, help="write the per-repeat splits here")
    add_threads_option(parser, default=os.cpu_count() or 1, why="as cpu_decode.py: every core")
    args = parser.parse_args(argv)
    apply_threads_option(args)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.checkpoint
        if folder is None:
            folder = Path(tmp) / "bf16"
            fields = {k: v for k, v in KNOWN_CONFIGS[QWEN3_0_6B].items() if k not in ("architectures", "torch_dtype")}
            write_random_qwen3(folder, **(fields | (QUICK_OVERRIDES if args.quick else {})))
        llm = LLM(folder, dtype=args.dtype, max_num_seqs=1, record_trace=False, enable_prefix_caching=False,
                  kv_cache_memory=64 << 20, model_backend=args.backend, quantization=args.quantization,
                  attention_backend=args.attention_backend)
        instrument(llm)
        runs = [profile_steps(llm, args.steps, args.prompt_tokens) for _ in range(args.repeats)]
    print(f"{folder if args.checkpoint else QWEN3_0_6B + ' shape, random weights'}; backend {llm.model_backend}, "
          f"attention {llm.engine.attention_backend.name}, "
          f"{args.dtype}, quantization {args.quantization}; {torch.get_num_threads()} torch threads; "
          f"{args.steps} steps x {args.repeats} repeats, median [min-max] ms per step")
    step = statistics.median(r["step_ms"] for r in runs)
    for key in ("unprofiled_ms", "step_ms", *CATEGORIES, "other"):
        values = [r[key] for r in runs]
        med = statistics.median(values)
        print(f"   {key:10} {med:8.2f} [{min(values):.2f}-{max(values):.2f}]  {med / step:6.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps({"backend": llm.model_backend, "runs_ms": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
