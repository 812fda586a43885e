"""Service tiers: interactive latency with and without a batch backlog, FCFS vs priority.

Interactive requests arrive by a Poisson clock while a backlog of batch-tier requests waits
(all queued at time 0); the same workload runs under --scheduling-policy fcfs and priority,
alone and with the backlog, in alternating repeats (course/experiments/tiers.py).  Prints:

    1. interactive TTFT and ITL P50/P99, the backlog's tokens/s and all tokens/s, per condition
       (medians of the repeats, [min-max])
    2. TTFT P99 under the backlog, FCFS / priority (the median of the per-repeat ratios)
    3. the batch tier's discount and cost per Mtok from the priority runs (course/ledger/tiers.py)

    python benchmarks/tiers.py                  # CPU, noodle-chef: ~3-5 minutes
    python benchmarks/tiers.py --quick          # a smoke run
    python benchmarks/tiers.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
from dataclasses import asdict

from common import add_threads_option, apply_threads_option

from minilm_engine.course.experiments.tiers import (
    TierWorkload,
    measure_tiers,
    p99_ttft_ratio,
    summary,
    tiers_table,
)
from minilm_engine.course.ledger import Prices
from minilm_engine.course.ledger.tiers import batch_tier_price


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--model", default="noodle-chef")
    parser.add_argument("--device", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--num-interactive", type=int, default=24)
    parser.add_argument("--rate", type=float, default=4.0, help="interactive requests per second")
    parser.add_argument("--num-batch", type=int, default=48)
    parser.add_argument("--gpu-cost-per-hour", type=float, default=0.10,
                        help="the machine's rent, for the cost per Mtok (default: a small 2-vCPU VM)")
    parser.add_argument("--json", default=None, help="write every run's numbers to this file")
    add_threads_option(parser)
    args = parser.parse_args()
    apply_threads_option(args)
    if args.quick:
        workload = TierWorkload(num_interactive=4, interactive_rate=20.0, interactive_output_len=6,
                                num_batch=6, batch_output_len=12)
        repeats = 1
    else:
        workload = TierWorkload(num_interactive=args.num_interactive, interactive_rate=args.rate,
                                num_batch=args.num_batch)
        repeats = args.repeats
    result = measure_tiers(workload, model=args.model, num_repeats=repeats, device=args.device,
                           max_num_seqs=args.max_num_seqs)
    print(f"{args.model}, max_num_seqs={args.max_num_seqs}, {platform.processor() or platform.machine()}, "
          f"{repeats} repeats rotating the order; workload: {workload}")
    print("\n1. interactive latency and throughput per condition (median [min-max] of the repeats)")
    print(tiers_table(result).to_string(index=False))
    print(f"\n2. interactive TTFT P99 under the backlog, FCFS / priority: {p99_ttft_ratio(result):.1f}x")
    price = batch_tier_price(result, Prices(gpu_cost_per_hour=args.gpu_cost_per_hour))
    print(f"\n3. batch tier at ${args.gpu_cost_per_hour}/h: interactive alone {price.interactive_tokens_per_s:.0f} tok/s "
          f"(${price.interactive_cost_per_mtok:.3f}/Mtok), with the backlog {price.with_backlog_tokens_per_s:.0f} tok/s "
          f"(${price.with_backlog_cost_per_mtok:.3f}/Mtok): discount {price.discount:.0%}")
    if args.json:
        data = {"workload": asdict(workload), "max_num_seqs": args.max_num_seqs,
                "conditions": {f"{policy}{'+backlog' if backlog else ''}": summary(runs)
                               for (policy, backlog), runs in result.runs.items()},
                "p99_ttft_ratio": p99_ttft_ratio(result), "batch_discount": price.discount}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
