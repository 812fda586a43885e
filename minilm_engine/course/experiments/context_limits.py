"""The context limit at a concurrency, put to the test: the KV arithmetic against the engine.

Contract: `context_at_concurrency(...)` builds one engine with a pool of `num_kv_blocks` blocks
(prefix caching off, so every request needs its own blocks) and, for each total length L in
`lengths` (prompt + output tokens), sends `concurrency` requests of exactly L tokens at once; one
row per L: the limit `KVCacheBudget.max_context_len(concurrency)` predicts, whether L is within
it, and what the engine did: the most requests running at once, the preemptions, the steps.

    L <= limit at C:   all C requests decode side by side, no preemption
    L >  limit at C:   the pool runs out mid-generation: the newest request is preempted
                       (recomputed later), so fewer than C run together and it takes longer

(The limit is one token conservative: the last sampled token's keys and values are never
written, so L = limit + 1 still fits; the arithmetic counts every token, as vLLM's does.)

This is the observation "context limits below what the architecture allows" from the inside:
the architecture would take 1024 tokens each; memory shared by C requests gives less.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pandas as pd

from minilm_engine.entrypoints.llm import LLM
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.experiments.prefill import corpus_token_ids
from minilm_engine.course.experiments.step_table import steps_dataframe


def context_at_concurrency(
    model: str = "noodle-chef",
    *,
    num_kv_blocks: int = 64,
    block_size: int = 16,
    concurrency: int = 4,
    lengths: Sequence[int] | None = None,
    output_len: int = 8,
    device: str | None = "cpu",
) -> pd.DataFrame:
    """One row per total length (see the module doc).  Default lengths: the limit, one block
    below and one block above it."""
    llm = LLM(model, device=device, num_kv_blocks=num_kv_blocks, block_size=block_size, max_num_seqs=concurrency,
              enable_prefix_caching=False)
    budget = llm.kv_budget
    limit = budget.max_context_len(concurrency)
    if lengths is None:
        lengths = [limit - block_size, limit, limit + block_size]
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    # Distinct real text per request: no two prompts share a block, so each needs its own.
    text = corpus_token_ids(llm.tokenizer, concurrency * max(lengths), seed=1)
    rows = []
    for length in lengths:
        if length <= output_len:
            raise ValueError(f"a length must exceed output_len ({output_len}), got {length}")
        num_prompt = length - output_len
        prompts = [{"prompt_token_ids": text[i * num_prompt:(i + 1) * num_prompt]} for i in range(concurrency)]
        first = len(llm.engine.trace.records)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)  # ignore_eos: exactly `length` tokens each
        wall = time.perf_counter() - start
        steps = steps_dataframe(llm.engine.trace).iloc[first:]
        rows.append({
            "context tokens": length,
            f"limit at {concurrency}": limit,
            "within limit": length <= limit,
            "most running at once": int(steps["num_running"].max()),
            "preemptions": int(steps["num_preempted"].sum()),
            "steps": len(steps),
            "wall s": wall,
        })
    table = pd.DataFrame(rows)
    table.attrs["arithmetic"] = budget.describe((1, concurrency))
    return table
