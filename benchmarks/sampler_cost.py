"""What the sampler costs per step at 64 and 256 running requests: batched vs one row at a time.

`sampler.sample` draws every sampling row at once (temperature, min-p, top-k and top-p as
(rows, vocab) operations, then argmax(p / q) with each row's q from its own generator);
`sampler.sample_one_at_a_time` is the readable reference it replaced, one row and one
torch.multinomial at a time.  Both give the same tokens (tests/test_sampling.py); this script
times them on random logits of Qwen3's vocabulary (151,936), for a few request mixes:

    greedy          temperature 0 (argmax only: the same code in both)
    temperature     temperature 0.8
    top-p           temperature 0.8, top_p 0.9 (the only setting that sorts)
    top-k + top-p   temperature 0.7, top_k 50, top_p 0.95
    mixed           a quarter each of the above

Every repeat times both, in alternating order; a cell is the median [min-max] of the repeats
in ms per call, and the ratio the median of the per-repeat ratios (> 1: batched is faster).

    python benchmarks/sampler_cost.py                 # a few minutes on 2 cores
    python benchmarks/sampler_cost.py --rows 64 --repeats 3 --vocab 32000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from common import add_threads_option, apply_threads_option

from minilm_engine import SamplingParams
from minilm_engine.worker.sampler import sample, sample_one_at_a_time

SETTINGS = {
    "greedy": SamplingParams(temperature=0),
    "temperature": SamplingParams(temperature=0.8),
    "top-p": SamplingParams(temperature=0.8, top_p=0.9),
    "top-k + top-p": SamplingParams(temperature=0.7, top_k=50, top_p=0.95),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="64,256")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--repeats", type=int, default=5)
    add_threads_option(parser, default=2, why="the engine's decode default on a 2-core machine")
    return parser.parse_args(argv)


def params_for(setting: str, num_rows: int) -> list[SamplingParams]:
    if setting != "mixed":
        return [SETTINGS[setting]] * num_rows
    kinds = list(SETTINGS.values())
    return [kinds[i % len(kinds)] for i in range(num_rows)]


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_threads_option(args)
    functions = {"one at a time": sample_one_at_a_time, "batched": sample}
    print(f"sampler cost per step, vocab {args.vocab:,}, {torch.get_num_threads()} threads: ms per call, "
          f"median [min-max] of {args.repeats} alternating repeats")
    print(f"{'rows':>5} {'setting':>14}" + "".join(f"{n:>26}" for n in functions) + f"{'speed-up':>10}")
    for num_rows in [int(r) for r in args.rows.split(",")]:
        logits = (torch.randn(num_rows, args.vocab, generator=torch.Generator().manual_seed(0)) * 3).bfloat16().float()
        for setting in [*SETTINGS, "mixed"]:
            params = params_for(setting, num_rows)
            runs = {n: [] for n in functions}
            tokens = {}
            for r in range(args.repeats):
                for name in (list(functions) if r % 2 == 0 else list(functions)[::-1]):
                    gens = [torch.Generator().manual_seed(i) for i in range(num_rows)]
                    start = time.perf_counter()
                    tokens[name] = functions[name](logits, params, gens).tolist()
                    runs[name].append((time.perf_counter() - start) * 1e3)
            assert tokens["batched"] == tokens["one at a time"], "the two samplers disagree"
            ratio = statistics.median(a / b for a, b in zip(runs["one at a time"], runs["batched"]))
            print(f"{num_rows:>5} {setting:>14}" + "".join(
                f"{statistics.median(v):10.1f} [{min(v):.1f}-{max(v):.1f}]".rjust(26) for v in runs.values())
                + f"{ratio:9.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
