"""Speculative decoding: noodle-apprentice drafts, noodle-chef verifies, in the continuous engine.

Prints, in one run (greedy requests of the noodle-shop corpus, EOS or --max-tokens ends them):

    1. batch 1: output tokens/s without and with speculation for K = 1..6, and the ratio
       (the issue's goal: >= 1.8x at the best K on a CPU); every run's tokens are checked equal
       to the run without speculation
    2. batch 4, 16, 64 at K = 0 and at the best batch-1 K: where speculation stops paying
    3. tokens per target forward (per verification round) vs the formula
       (1 - alpha^(K+1)) / (1 - alpha) at the measured alpha, and the per-position acceptance

On a GPU the same script runs the engine's defaults there (Triton attention, CUDA graphs for
plain decode steps; verification chunks and the draft's passes run eagerly).

    python benchmarks/spec_decode.py                 # CPU: ~2-4 minutes
    python benchmarks/spec_decode.py --quick         # K in (1, 4), batches 1 and 4, short outputs
    python benchmarks/spec_decode.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform

import torch
from common import add_threads_option, apply_threads_option

from minilm_engine.course.experiments.speculative import (
    measure_speculation,
    speedup_table,
    tokens_per_forward_table,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="auto",
                        help="the engines' dtype (auto: fp32 on a CPU, bf16 on a GPU; float32 checks the tokens there)")
    parser.add_argument("--repeats", type=int, default=2, help="best of N timed runs per configuration")
    parser.add_argument("--json", default=None, help="write the tables to this file")
    add_threads_option(parser)
    args = parser.parse_args()
    apply_threads_option(args)
    ks = (1, 4) if args.quick else (1, 2, 3, 4, 5, 6)
    max_tokens = args.max_tokens or (24 if args.quick else 128)
    batches = (4,) if args.quick else (4, 16, 64)
    repeats = 1 if args.quick else args.repeats
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} thread(s)"
    print(f"noodle-chef (target) + noodle-apprentice (draft), greedy, max_tokens={max_tokens}, on {where}\n")

    print("1. batch 1: output tokens/s without (K = 0) and with speculation")
    batch1 = measure_speculation(num_speculative_tokens=ks, batch_sizes=(1,), max_tokens=max_tokens, num_prompts=2,
                                 num_repeats=repeats, device=str(device), dtype=args.dtype)
    table1 = speedup_table(batch1)
    _print_speedups(table1)
    best = max((r for r in table1 if r["K"]), key=lambda r: r["speedup"])
    goal = "meets" if best["speedup"] >= 1.8 else "misses"
    print(f"   best K = {best['K']}: {best['speedup']:.2f}x ({goal} the 1.8x goal)\n")

    print(f"2. larger batches, K = 0 vs K = {best['K']}: where speculation stops paying")
    bigger = measure_speculation(num_speculative_tokens=(best["K"],), batch_sizes=batches, max_tokens=max_tokens,
                                 num_repeats=repeats, device=str(device), dtype=args.dtype)
    table2 = speedup_table(bigger)
    _print_speedups(table2)

    print("\n3. tokens per target forward (one verification round) vs (1 - a^(K+1)) / (1 - a) at the measured a")
    table3 = tokens_per_forward_table(batch1 + bigger)
    print(f"   {'batch':>5} {'K':>2} {'alpha':>6} {'measured':>9} {'formula':>8} {'ratio':>6}  acceptance by position")
    for r in table3:
        per_pos = " ".join("-" if a is None else f"{a:.2f}" for a in r["acceptance_rate_per_pos"])
        print(f"   {r['batch_size']:>5} {r['K']:>2} {r['alpha']:>6.3f} {r['measured_tokens_per_round']:>9.2f} "
              f"{r['formula_tokens_per_round']:>8.2f} {r['measured_tokens_per_round'] / r['formula_tokens_per_round']:>6.2f}  {per_pos}")
    print("   (measured < formula mostly where rounds near max_tokens draft fewer than K tokens)")
    all_same = all(r["same_tokens"] for r in table1 + table2)
    print(f"\nevery run's tokens equal the run without speculation: {all_same}")
    if not all_same and args.dtype != "float32" and device.type != "cpu":
        print("   (in bf16 or fp16 a verification pass and a decode step round differently: --dtype float32 checks them)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": where, "max_tokens": max_tokens, "batch1": table1, "batches": table2,
                       "tokens_per_forward": table3, "best_k": best["K"], "best_speedup": best["speedup"],
                       "all_same_tokens": all_same}, f, indent=2)
    return 0 if all_same else 1


def _print_speedups(rows: list[dict]) -> None:
    print(f"   {'batch':>5} {'K':>2} {'tokens/s':>9} {'speedup':>8} {'forwards':>9} {'accepted':>9}  same tokens")
    for r in rows:
        accepted = "-" if r["draft_acceptance_rate"] is None else f"{r['draft_acceptance_rate']:.1%}"
        print(f"   {r['batch_size']:>5} {r['K']:>2} {r['tokens_per_s']:>9.1f} {r['speedup']:>7.2f}x "
              f"{r['target_forwards']:>9} {accepted:>9}  {r['same_tokens']}")


if __name__ == "__main__":
    raise SystemExit(main())
