"""What a grammar costs per engine step: the same batch with and without structured outputs.

Each repeat generates `--steps` tokens for a batch of B requests twice, in alternating order:
once unconstrained (ignore_eos, so every request runs all steps) and once with every request
constrained to a JSON schema that cannot complete within the steps (an array of at least 50
orders), so both runs take the same number of steps.  A cell is the median [min-max] of the
repeats in ms per step (prefill included, the same in both), and the overhead the median of the
per-repeat ratios.  The second table times the mask alone (fill each matcher's bitmask row, then
the one masked fill: `worker/structured_output.apply_grammar_bitmask`) at each batch size.

    python benchmarks/structured_outputs.py                  # the shipped chef, batches 1 and 16
    python benchmarks/structured_outputs.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import add_threads_option, apply_threads_option

from minilm_engine import LLM, SamplingParams
from minilm_engine.core.sampling_params import StructuredOutputsParams
from minilm_engine.worker.structured_output import apply_grammar_bitmask

ORDER = {
    "type": "object",
    "properties": {"dish": {"type": "string", "enum": ["ramen", "udon", "soba"]}, "spicy": {"type": "boolean"},
                   "bowls": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["dish", "spicy", "bowls"],
}
SCHEMA = {"type": "array", "items": ORDER, "minItems": 50}  # no batch completes it within the steps


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="noodle-chef")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="batches 1 and 4, 8 steps, 2 repeats")
    add_threads_option(parser, default=2, why="the engine's decode default on a 2-core machine")
    return parser.parse_args(argv)


def ms_per_step(llm: LLM, batch_size: int, steps: int, grammar: bool) -> float:
    structured = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True) if grammar else None
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=not grammar, structured_outputs=structured)
    prompts = [f"Order for table {i}:" for i in range(batch_size)]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == steps for o in outputs), "a run ended early: the steps differ"
    return 1000 * elapsed / steps


def mask_ms(llm: LLM, batch_size: int, repeats: int = 50) -> float:
    """The mask alone for `batch_size` constrained rows (each matcher at its start)."""
    params = SamplingParams(temperature=0, structured_outputs=StructuredOutputsParams(json=SCHEMA))
    requests = [llm.input_processor.make_request(f"m{i}", "Hello", params) for i in range(batch_size)]
    logits = torch.randn(batch_size, llm.config.vocab_size)
    apply_grammar_bitmask(logits, requests)  # warm
    start = time.perf_counter()
    for _ in range(repeats):
        apply_grammar_bitmask(logits, requests)
    return 1000 * (time.perf_counter() - start) / repeats


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):7.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_threads_option(args)
    if args.quick:
        args.batch_sizes, args.steps, args.repeats = "1,4", 8, 2
    llm = LLM(args.model, device="cpu", record_trace=False)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    ms_per_step(llm, 1, 2, grammar=True)  # warm: xgrammar's import, the vocabulary, the compile
    print(f"{args.model}: ms per step, {args.steps} steps, median [min-max] of {args.repeats} alternating repeats")
    print(f"{'batch':>5}  {'no grammar':>22}  {'JSON schema':>22}  overhead")
    for batch_size in batch_sizes:
        plain, constrained = [], []
        for repeat in range(args.repeats):
            for grammar in ((False, True) if repeat % 2 == 0 else (True, False)):
                (constrained if grammar else plain).append(ms_per_step(llm, batch_size, args.steps, grammar))
        overhead = statistics.median(c / p - 1 for p, c in zip(plain, constrained))
        print(f"{batch_size:>5}  {cell(plain):>22}  {cell(constrained):>22}  {100 * overhead:+6.1f}%")
    print("\nthe mask alone (fill every grammar row's bitmask, one masked fill), ms per step")
    for batch_size in batch_sizes:
        print(f"{batch_size:>5}  {mask_ms(llm, batch_size):7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
