"""What one engine step costs besides the model: the tiny model at 64 and 256 running requests,
the shipped chef at 1 and 16.

A step's host work (schedule, block tables, slot mapping, flattening, sampling, appending
tokens, the prefix-cache bookkeeping) grows with the number of running requests, while a tiny
model's forward barely does: on a model with hidden size 32 the step time *is* that host work.
This script fills the engine with N greedy requests of a 64-token prompt (some sharing a
prefix), lets them all reach decode, then times `engine.step()` over the next decode steps.

`--model noodle-chef` times the shipped chef (6 layers, hidden 320) at batch 1 and 16 instead:
a real model whose decode step on a CPU is still mostly per-step work rather than arithmetic.
Its `prepare` column is the part of the step that builds the inputs (`ModelRunner.prepare`:
block tables, positions, slots, the copy to the device).

It uses only the public engine API, so the same file can be run against an older checkout to
compare before and after a change (copy it there, or run it with PYTHONPATH pointing at one):

    python benchmarks/step_cost.py                       # N = 64 and 256, ~1 min
    python benchmarks/step_cost.py --model noodle-chef   # the chef at N = 1 and 16, ~1 min
    python benchmarks/step_cost.py --quick               # the smoke test
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


MODELS = {"tiny": "64,256", "noodle-chef": "1,16"}  # model -> default numbers of running requests


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=list(MODELS), default="tiny",
                        help="tiny: random weights, hidden size 32; noodle-chef: the shipped chef")
    parser.add_argument("--sizes", default=None, help="numbers of running requests (default: the model's)")
    parser.add_argument("--steps", type=int, default=20, help="decode steps timed per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: N = 1 and 4, 3 steps, 1 repeat")
    parser.add_argument("--json", default=None)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: time.perf_counter; cpu: time.process_time (robust to a busy machine)")
    add_threads_option(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.steps, args.repeats = args.sizes or "1,4", 3, 1
    args.sizes = args.sizes or MODELS[args.model]
    return args


def decode_step_seconds(
    llm: LLM, num_requests: int, num_steps: int, clock=time.perf_counter
) -> tuple[list[float], list[float]]:
    """Times of `num_steps` engine steps once `num_requests` requests are all decoding, and of
    the `ModelRunner.prepare` inside each."""
    engine = llm.engine
    runner = engine.runner
    prepare = runner.prepare
    prepare_times: list[float] = []

    def timed_prepare(sched):
        start = clock()
        inputs = prepare(sched)
        prepare_times.append(clock() - start)
        return inputs

    shared = [(7 * i) % 1000 + 10 for i in range(48)]  # a shared system prompt: prefix-cache hits
    params = SamplingParams(temperature=0, max_tokens=num_steps + 8, ignore_eos=True)
    for i in range(num_requests):
        tail = [(13 * i + 5 * j) % 1000 + 10 for j in range(16)]
        engine.add_request(f"r{i}", {"prompt_token_ids": shared + tail}, params)
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.requests.values()):
        engine.step_requests()  # the prompts (chunked by the token budget) and first tokens
    times = []
    runner.prepare = timed_prepare  # on this instance only, for the timed steps
    try:
        for _ in range(num_steps):
            start = clock()
            engine.step_requests()
            times.append(clock() - start)
    finally:
        del runner.prepare
    while engine.has_unfinished_requests():
        engine.step_requests()
    return times, prepare_times


def make_llm(model: str, tmp: str, sizes: list[int]) -> LLM:
    """The engine under test: big enough a pool and budget for `max(sizes)` requests at once."""
    settings = dict(max_num_seqs=max(sizes), max_num_batched_tokens=4096, record_trace=False,
                    num_kv_blocks=max(sizes) * 8 + 64)
    if model == "tiny":
        write_random_qwen3(tmp, **TINY)
        return LLM(tmp, **settings)
    return LLM(model, dtype="float32", **settings)


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_threads_option(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    results = {"torch": torch.__version__, "threads": torch.get_num_threads(), "clock": args.clock,
               "model": args.model, "sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        llm = make_llm(args.model, tmp, sizes)
        decode_step_seconds(llm, 4, 2)  # warm-up
        what = "tiny model: the step is host work" if args.model == "tiny" else f"{args.model}, float32"
        print(f"engine step time ({args.clock} clock) at N running requests ({what}), {args.steps} decode "
              f"steps x {args.repeats} repeats, {results['threads']} torch thread(s), {llm.engine.model.device}")
        print(f"   {'N':>5} {'median step':>14} {'[min-max] of repeats':>24} {'per request':>14} {'prepare':>11}")
        for n in sizes:
            runs = [decode_step_seconds(llm, n, args.steps, clock) for _ in range(args.repeats)]
            medians = [statistics.median(steps) * 1e3 for steps, _ in runs]
            prepare = statistics.median(statistics.median(p) * 1e3 for _, p in runs)
            median = statistics.median(medians)
            results["sizes"][str(n)] = {"median_ms": median, "min_ms": min(medians), "max_ms": max(medians),
                                        "per_request_us": median / n * 1e3, "prepare_ms": prepare}
            print(f"   {n:>5} {median:>11.2f} ms {f'[{min(medians):.2f}-{max(medians):.2f}]':>24} "
                  f"{median / n * 1e3:>11.1f} us {prepare:>8.3f} ms", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
