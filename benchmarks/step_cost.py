"""What one engine step costs besides the model: at 64 and 256 running requests.

A step's host work (schedule, block tables, slot mapping, flattening, sampling, appending
tokens, the prefix-cache bookkeeping) grows with the number of running requests, while a tiny
model's forward barely does: on a model with hidden size 32 the step time *is* that host work.
This script fills the engine with N greedy requests of a 64-token prompt (some sharing a
prefix), lets them all reach decode, then times `engine.step()` over the next decode steps.

It uses only the public engine API, so the same file can be run against an older checkout to
compare before and after a change (copy it there, or run it with PYTHONPATH pointing at one):

    python benchmarks/step_cost.py                       # N = 64 and 256, ~1 min
    python benchmarks/step_cost.py --sizes 8 --steps 5   # the smoke test
    PYTHONPATH=/path/to/old/checkout python benchmarks/step_cost.py --json old.json

Each size prints the median step time over `--steps` decode steps, [min-max] of `--repeats`
repeats' medians, and the per-request cost (median / N).  `--clock cpu` times the process's CPU
seconds instead of the wall clock: other programs on a busy machine do not inflate them (with
one torch thread they are the wall time of an idle machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import add_threads_option, apply_threads_option

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.experiments.quantization import write_random_qwen3

TINY = dict(vocab_size=2048, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,256", help="numbers of running requests")
    parser.add_argument("--steps", type=int, default=20, help="decode steps timed per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: time.perf_counter; cpu: time.process_time (robust to a busy machine)")
    add_threads_option(parser)
    return parser.parse_args(argv)


def decode_step_seconds(llm: LLM, num_requests: int, num_steps: int, clock=time.perf_counter) -> list[float]:
    """Times of `num_steps` engine steps once `num_requests` requests are all decoding."""
    engine = llm.engine
    shared = [(7 * i) % 1000 + 10 for i in range(48)]  # a shared system prompt: prefix-cache hits
    params = SamplingParams(temperature=0, max_tokens=num_steps + 8, ignore_eos=True)
    for i in range(num_requests):
        tail = [(13 * i + 5 * j) % 1000 + 10 for j in range(16)]
        engine.add_request(f"r{i}", {"prompt_token_ids": shared + tail}, params)
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.requests.values()):
        engine.step_requests()  # the prompts (chunked by the token budget) and first tokens
    times = []
    for _ in range(num_steps):
        start = clock()
        engine.step_requests()
        times.append(clock() - start)
    while engine.has_unfinished_requests():
        engine.step_requests()
    return times


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_threads_option(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    results = {"torch": torch.__version__, "threads": torch.get_num_threads(), "clock": args.clock, "sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        write_random_qwen3(tmp, **TINY)
        llm = LLM(tmp, max_num_seqs=max(sizes), max_num_batched_tokens=4096, record_trace=False,
                  num_kv_blocks=max(sizes) * 8 + 64)
        decode_step_seconds(llm, 4, 2)  # warm-up
        print(f"engine step time ({args.clock} clock) at N running requests (tiny model: the step is host "
              f"work), {args.steps} decode steps x {args.repeats} repeats, {results['threads']} torch thread(s)")
        print(f"   {'N':>5} {'median step':>14} {'[min-max] of repeats':>24} {'per request':>14}")
        for n in sizes:
            medians = [statistics.median(decode_step_seconds(llm, n, args.steps, clock)) * 1e3
                       for _ in range(args.repeats)]
            median = statistics.median(medians)
            results["sizes"][str(n)] = {"median_ms": median, "min_ms": min(medians), "max_ms": max(medians),
                                        "per_request_us": median / n * 1e3}
            print(f"   {n:>5} {median:>11.2f} ms {f'[{min(medians):.2f}-{max(medians):.2f}]':>24} "
                  f"{median / n * 1e3:>11.1f} us", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
