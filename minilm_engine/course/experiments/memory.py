"""Chapter 03's measurements: what a contiguous KV reservation wastes next to paging, how many
requests one KV budget holds under each, and what a shared system prompt saves.

Contract: every function runs the real continuous engine (an `LLM` with strategy="continuous")
or reads what it returned; nothing here changes how the engine allocates.  The two layouts are
compared per request, in token slots (one slot = the keys and values of one token, all layers):

    contiguous: a request reserves its worst case up front and keeps it until it ends
        reserve "max_tokens":     prompt + max_tokens slots   (what the caller allowed)
        reserve "max_model_len":  max_model_len slots         (what the model allows)
    paged:      ceil(tokens / block_size) blocks, taken one at a time as the request grows

    a request of 10 prompt + 27 output tokens, block_size 16, max_tokens 64:
        paged       [################|################|#####...........]   48 slots, 11 empty
        contiguous  [#####################################.....................................]
                                                                   74 slots, 37 never written
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from minilm_engine.core.kv_cache_manager import cdiv
from minilm_engine.entrypoints.llm import LLM
from minilm_engine.core.outputs import RequestOutput
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.experiments.step_table import steps_dataframe

# -- waste per request ------------------------------------------------------------------------


def footprint_table(
    outputs: Sequence[RequestOutput],
    sampling_params: SamplingParams | Sequence[SamplingParams],
    block_size: int,
    max_model_len: int,
):
    """One row per finished request: its KV slots under paging and under both reservations.

    Counted at the end of each request's life, when it holds the most: the paged numbers are
    its peak (earlier it held fewer blocks), the contiguous ones hold from start to end.
    Columns: prompt_tokens, output_tokens, tokens, paged_slots, paged_empty (the unfilled tail
    of the last block: internal fragmentation, < block_size), reserved_max_tokens,
    unused_max_tokens, reserved_max_model_len, unused_max_model_len.
    """
    import pandas as pd

    if isinstance(sampling_params, SamplingParams):
        sampling_params = [sampling_params] * len(outputs)
    if len(sampling_params) != len(outputs):
        raise ValueError(f"got {len(sampling_params)} SamplingParams for {len(outputs)} outputs")
    rows = []
    for out, params in zip(outputs, sampling_params):
        num_prompt = len(out.prompt_token_ids)
        num_tokens = num_prompt + len(out.outputs[0].token_ids)
        paged = cdiv(num_tokens, block_size) * block_size
        max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len
        reserved = min(num_prompt + max_tokens, max_model_len)
        rows.append(
            {
                "request_id": out.request_id,
                "prompt_tokens": num_prompt,
                "output_tokens": num_tokens - num_prompt,
                "tokens": num_tokens,
                "paged_slots": paged,
                "paged_empty": paged - num_tokens,
                "reserved_max_tokens": reserved,
                "unused_max_tokens": reserved - num_tokens,
                "reserved_max_model_len": max_model_len,
                "unused_max_model_len": max_model_len - num_tokens,
            }
        )
    return pd.DataFrame(rows)


def waste_summary(table) -> dict[str, float]:
    """Share of reserved slots never written, per layout, over all requests of `table`."""
    tokens = table["tokens"].sum()
    return {
        layout: 1 - tokens / table[column].sum()
        for layout, column in (
            ("paged", "paged_slots"),
            ("contiguous, prompt + max_tokens", "reserved_max_tokens"),
            ("contiguous, max_model_len", "reserved_max_model_len"),
        )
    }


# -- how many requests one budget holds ---------------------------------------------------------


@dataclass
class BudgetResult:
    """How many requests ran at once in a pool of `num_kv_blocks` blocks, and how many would fit
    the same slots if each reserved its worst case contiguously."""

    num_kv_blocks: int
    block_size: int
    num_requests: int
    max_running_paged: int  # the most requests running in one step (the trace's num_running)
    mean_running_paged: float  # averaged over the steps in which some request was waiting
    num_preemptions: int  # requests sent back to wait because the pool ran dry
    num_steps: int
    fits_max_tokens: int  # contiguous, prompt + max_tokens each, in arrival order
    fits_max_model_len: int  # contiguous, max_model_len each
    steps: object = field(repr=False)  # the run's steps_dataframe(engine.trace)

    @property
    def budget_slots(self) -> int:
        return self.num_kv_blocks * self.block_size


def contiguous_capacity(budget_slots: int, reservations: Sequence[int]) -> int:
    """How many requests, taken in arrival order, fit `budget_slots` with these reservations."""
    used = count = 0
    for slots in reservations:
        if used + slots > budget_slots:
            break
        used += slots
        count += 1
    return count


def concurrency_under_budget(
    prompts: Sequence[str],
    sampling_params: SamplingParams,
    num_kv_blocks: int,
    *,
    model: str | Path | None = None,
    block_size: int = 16,
    device: str | None = None,
) -> BudgetResult:
    """Run `prompts` on a paged engine whose pool holds `num_kv_blocks` blocks and nothing limits
    the batch but memory (max_num_seqs = number of prompts); compare with contiguous reservation.
    """
    llm = LLM(
        model, device=device, num_kv_blocks=num_kv_blocks, block_size=block_size,
        max_num_seqs=len(prompts), enable_prefix_caching=False,
    )
    llm.generate(list(prompts), sampling_params, use_tqdm=False)
    steps = steps_dataframe(llm.engine.trace)
    crowded = steps[steps["num_waiting"] > 0]
    budget = num_kv_blocks * block_size
    # A contiguous cache reserves the model's whole context per request: the architecture's,
    # not the max_model_len the paged engine derived from this small pool.
    context = llm.config.max_position_embeddings
    max_tokens = sampling_params.max_tokens or context
    reservations = [min(len(llm.tokenizer.encode(p)) + max_tokens, context) for p in prompts]
    return BudgetResult(
        num_kv_blocks=num_kv_blocks,
        block_size=block_size,
        num_requests=len(prompts),
        max_running_paged=int(steps["num_running"].max()),
        mean_running_paged=float(crowded["num_running"].mean()) if len(crowded) else float("nan"),
        num_preemptions=int(steps["num_preempted"].sum()),
        num_steps=len(steps),
        fits_max_tokens=contiguous_capacity(budget, reservations),
        fits_max_model_len=budget // context,
        steps=steps,
    )


# -- prefix sharing -----------------------------------------------------------------------------


def prefix_sharing_run(llm: LLM, system_prompt: str, questions: Sequence[str], max_tokens: int = 1):
    """Send `system_prompt + question` for each question, one after the other, each alone in the
    engine; one row per request: TTFT and how many prompt tokens were computed vs found cached.

    Run it on an engine with prefix caching on and on one with it off: the first request is a
    miss either way, the later ones find the system prompt's full blocks in the cache (on).
    The prefix cache is emptied first, so a repeated call measures the same thing.
    """
    import pandas as pd

    engine = llm.engine
    engine.block_pool.reset_prefix_cache()
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    rows = []
    for i, question in enumerate(questions):
        first_step = len(engine.trace.records)
        (out,) = llm.generate([system_prompt + question], params, use_tqdm=False)
        chunks = [c for rec in engine.trace.records[first_step:] for c in rec.chunks]
        rows.append(
            {
                "request": i,
                "prompt_tokens": len(out.prompt_token_ids),
                "cached_tokens": sum(c.num_cached_tokens for c in chunks),
                "computed_prompt_tokens": sum(c.num_prefill_tokens for c in chunks),
                "ttft_s": out.metrics.ttft,
            }
        )
    return pd.DataFrame(rows)


# -- the two layouts, run on one workload --------------------------------------------------------


@dataclass
class LayoutRun:
    """One layout's run of a workload: wall time, engine steps, preemptions, the requests running
    at each step, and the tokens each request produced (by request index)."""

    layout: str
    max_running: int
    seconds: float
    num_steps: int
    num_preemptions: int
    running: list  # num_running per step
    token_ids: list  # per request, in prompt order


def paged_vs_contiguous(prompts: Sequence[str], sampling_params: SamplingParams, num_kv_blocks: int, *,
                        model: str | Path | None = None, block_size: int = 16, num_rounds: int = 3,
                        device: str | None = None) -> dict[str, list[LayoutRun]]:
    """Run `prompts` to completion under each layout on the same KV budget, rounds alternating.

    "paged": the engine as it is: a request is admitted when its prompt's blocks are free, and the
    pool may run dry later (preemption, recompute).  "contiguous": the same engine admitting a
    request only when its whole contiguous reservation (prompt + max_tokens, `contiguous_capacity`)
    fits beside the others', which for these equal reservations means at most that many at once
    (`max_num_seqs`); that is all a contiguous cache changes about scheduling, and it never needs
    to preempt.  Both compute with the same paged kernels, so the comparison is the layouts'
    admission, not two attention implementations.
    """
    probe = LLM(model, device=device, num_kv_blocks=num_kv_blocks, block_size=block_size, enable_prefix_caching=False)
    context = probe.config.max_position_embeddings
    max_tokens = sampling_params.max_tokens or context
    reservations = [min(len(probe.tokenizer.encode(p)) + max_tokens, context) for p in prompts]
    fits = contiguous_capacity(num_kv_blocks * block_size, reservations)
    if fits == 0:
        raise ValueError("not even one contiguous reservation fits this budget: give it more blocks")
    del probe
    engines = {layout: LLM(model, device=device, num_kv_blocks=num_kv_blocks, block_size=block_size,
                           max_num_seqs=seqs, enable_prefix_caching=False)
               for layout, seqs in (("paged", len(prompts)), ("contiguous", fits))}
    for llm in engines.values():
        llm.generate(list(prompts[:2]), SamplingParams(max_tokens=4), use_tqdm=False)  # warm up
    runs: dict[str, list[LayoutRun]] = {layout: [] for layout in engines}
    for round_index in range(num_rounds):
        order = list(engines) if round_index % 2 == 0 else list(engines)[::-1]
        for layout in order:
            llm = engines[layout]
            llm.engine.trace.clear()
            start = time.perf_counter()
            outputs = llm.generate(list(prompts), sampling_params, use_tqdm=False)
            seconds = time.perf_counter() - start
            steps = steps_dataframe(llm.engine.trace)
            runs[layout].append(LayoutRun(
                layout=layout, max_running=fits if layout == "contiguous" else len(prompts), seconds=seconds,
                num_steps=len(steps), num_preemptions=int(steps["num_preempted"].sum()),
                running=steps["num_running"].tolist(), token_ids=[list(o.outputs[0].token_ids) for o in outputs]))
    return runs
