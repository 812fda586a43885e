"""Recompute vs KV cache: how much does caching keys and values save as generations grow?

Runs `strategy="no_cache"` and `strategy="kv_cache"` side by side in one process on the same
prompt and prints, for each generation length, both times and their ratio.  The two runs
alternate and each is repeated, keeping the fastest, because a shared machine is noisy.

    python benchmarks/kv_cache.py                    # shipped model, CPU
    python benchmarks/kv_cache.py --lengths 64 256 --model noodle-apprentice
"""

from __future__ import annotations

import argparse
import time

import torch

from minilm_engine import LLM, SamplingParams
from minilm_engine.data.noodle_corpus import sample_prompts


def time_generation(llm: LLM, prompt: str, num_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
    start = time.perf_counter()
    (out,) = llm.generate(prompt, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert len(out.outputs[0].token_ids) == num_tokens
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    llms = {s: LLM(args.model, device=args.device, strategy=s) for s in ("no_cache", "kv_cache")}
    ref = llms["kv_cache"]
    prompt = sample_prompts(1, seed=0)[0]
    print(f"model: {ref.model_path.name}, {ref.num_parameters / 1e6:.1f}M parameters, "
          f"{ref.device}, {ref.dtype}, torch threads: {torch.get_num_threads()}")
    print(f"prompt: {len(ref.tokenizer.encode(prompt))} tokens\n")
    time_generation(ref, prompt, 8)  # warm-up
    print(f"{'new tokens':>10} {'no_cache s':>11} {'kv_cache s':>11} {'speed-up':>9}")
    for n in args.lengths:
        best = {s: float("inf") for s in llms}
        for _ in range(args.repeats):
            for name, llm in llms.items():
                best[name] = min(best[name], time_generation(llm, prompt, n))
        print(f"{n:>10} {best['no_cache']:>11.3f} {best['kv_cache']:>11.3f} "
              f"{best['no_cache'] / best['kv_cache']:>8.1f}x")


if __name__ == "__main__":
    main()
