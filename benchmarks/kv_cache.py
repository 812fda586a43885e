"""Recompute vs KV cache: how much does caching keys and values save as generations grow?

Runs `strategy="no_cache"` and `strategy="kv_cache"` side by side in one process on the same
prompt and prints, for each generation length, both times and their ratio, next to the ratio
of tokens each pushes through the model.  The two runs alternate and each is repeated, keeping
the fastest, because a shared machine is noisy.  The measuring code is the package's
(`minilm_engine.course.experiments.kv_growth`), the same that chapter 02 runs.

    python benchmarks/kv_cache.py                    # shipped model, CPU
    python benchmarks/kv_cache.py --lengths 64 256 --model noodle-apprentice
"""

from __future__ import annotations

import argparse

import torch

from common import add_threads_option, apply_threads_option

from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.course.noodle_corpus import sample_prompts
from minilm_engine.course.experiments.kv_growth import compare_strategies, num_token_passes, time_generation


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--repeats", type=int, default=2)
    add_threads_option(parser)
    args = parser.parse_args()
    apply_threads_option(args)

    llms = {s: BaselineLLM(args.model, device=args.device, strategy=s) for s in ("no_cache", "kv_cache")}
    ref = llms["kv_cache"]
    prompt = sample_prompts(1, seed=0)[0]
    num_prompt_tokens = len(ref.tokenizer.encode(prompt))
    print(f"model: {ref.model_path.name}, {ref.num_parameters / 1e6:.1f}M parameters, "
          f"{ref.device}, {ref.dtype}, torch threads: {torch.get_num_threads()}")
    print(f"prompt: {num_prompt_tokens} tokens\n")
    for llm in llms.values():
        time_generation(llm, prompt, 8)  # warm-up
    header = ("new tokens", "no_cache s", "kv_cache s", "speed-up", "token ratio")
    print("{:>10} {:>11} {:>11} {:>9} {:>12}".format(*header))
    for row in compare_strategies(llms, prompt, args.lengths, args.repeats):
        n = row["num_new_tokens"]
        full = num_token_passes(num_prompt_tokens, n, cached=False)
        cached = num_token_passes(num_prompt_tokens, n, cached=True)
        print(f"{n:>10} {row['no_cache']:>11.3f} {row['kv_cache']:>11.3f} "
              f"{row['no_cache'] / row['kv_cache']:>8.1f}x {full / cached:>11.1f}x")


if __name__ == "__main__":
    main()
