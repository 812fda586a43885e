"""Tests for minilm_engine.course.experiments.memory (chapter 03) and the paging exercises.

The waste arithmetic is checked exactly on hand-made outputs; the engine-driven functions run
the shipped noodle-apprentice (0.6M parameters) on a few short requests.
"""

from __future__ import annotations

import pytest

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.noodle_corpus import SYSTEM_PROMPT, sample_prompts
from minilm_engine.course.experiments import memory
from minilm_engine.core.block_pool import hash_block_tokens
from minilm_engine.core.kv_cache_utils import slot_mapping
from minilm_engine.core.outputs import CompletionOutput, RequestOutput
from minilm_engine.course.teaching.exercises_paging import (
    chain_hashes,
    engine_cached_prefix_blocks,
    engine_prefill_chunks,
)

MODEL = "noodle-apprentice"


def output(request_id: str, num_prompt: int, num_output: int) -> RequestOutput:
    completion = CompletionOutput(0, "", list(range(num_output)), "stop")
    return RequestOutput(request_id, None, list(range(num_prompt)), [completion], True)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(MODEL, num_kv_blocks=64, block_size=16, max_num_seqs=8)


# -- footprints ----------------------------------------------------------------------------------


def test_footprint_table_counts_slots_exactly() -> None:
    outputs = [output("a", 10, 27), output("b", 5, 11), output("c", 16, 0)]
    params = SamplingParams(max_tokens=64)
    table = memory.footprint_table(outputs, params, block_size=16, max_model_len=128)
    assert table["tokens"].tolist() == [37, 16, 16]
    assert table["paged_slots"].tolist() == [48, 16, 16]
    assert table["paged_empty"].tolist() == [11, 0, 0]
    assert table["reserved_max_tokens"].tolist() == [74, 69, 80]
    assert table["unused_max_tokens"].tolist() == [37, 53, 64]
    assert table["unused_max_model_len"].tolist() == [91, 112, 112]
    assert (table["paged_empty"] < 16).all()

    waste = memory.waste_summary(table)
    assert waste["paged"] == pytest.approx(1 - 69 / 80)
    assert waste["contiguous, prompt + max_tokens"] == pytest.approx(1 - 69 / 223)
    assert waste["contiguous, max_model_len"] == pytest.approx(1 - 69 / 384)


def test_footprint_table_caps_reservation_at_the_context_and_checks_lengths() -> None:
    outputs = [output("a", 100, 20)]
    table = memory.footprint_table(outputs, [SamplingParams(max_tokens=None)], 16, 128)
    assert table["reserved_max_tokens"].tolist() == [128]
    with pytest.raises(ValueError, match="SamplingParams"):
        memory.footprint_table(outputs, [SamplingParams(), SamplingParams()], 16, 128)


def test_contiguous_capacity_takes_requests_in_arrival_order() -> None:
    # First come, first served: the third would need 110, and the fourth waits behind it.
    assert memory.contiguous_capacity(100, [40, 40, 30, 10]) == 2
    assert memory.contiguous_capacity(100, [100]) == 1
    assert memory.contiguous_capacity(99, [100, 1]) == 0
    assert memory.contiguous_capacity(100, []) == 0


# -- engine-driven ---------------------------------------------------------------------------


def test_concurrency_under_budget_runs_everything_in_a_small_pool() -> None:
    prompts = sample_prompts(8, seed=3)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    result = memory.concurrency_under_budget(prompts, params, num_kv_blocks=12, model=MODEL)
    assert result.budget_slots == 12 * 16
    assert result.num_requests == 8
    assert 1 <= result.max_running_paged <= 8
    assert result.num_steps == len(result.steps)
    # Contiguous: prompt + 40 slots each (prompts of 6-18 tokens) in 192 slots.
    assert result.fits_max_tokens == 3
    assert result.fits_max_model_len == 0  # 1024 > 192
    # Every request made all its tokens: 40 decode or sampling steps each, and the pool is empty.
    assert result.steps["num_used_blocks"].iloc[-1] == 0


def test_prefix_sharing_run_finds_the_system_prompt_cached(llm: LLM) -> None:
    questions = sample_prompts(3, seed=5)
    on = memory.prefix_sharing_run(llm, SYSTEM_PROMPT, questions)
    assert on["cached_tokens"][0] == 0
    assert (on["cached_tokens"][1:] >= 16 * (len(llm.tokenizer.encode(SYSTEM_PROMPT)) // 16)).all()
    assert (on["cached_tokens"] + on["computed_prompt_tokens"] == on["prompt_tokens"]).all()
    assert (on["ttft_s"] > 0).all()
    # Calling again starts from an empty cache: the same counts.
    again = memory.prefix_sharing_run(llm, SYSTEM_PROMPT, questions)
    assert again["cached_tokens"].tolist() == on["cached_tokens"].tolist()

    off_llm = LLM(MODEL, num_kv_blocks=64, block_size=16, enable_prefix_caching=False)
    off = memory.prefix_sharing_run(off_llm, SYSTEM_PROMPT, questions)
    assert (off["cached_tokens"] == 0).all()
    assert (off["computed_prompt_tokens"] == off["prompt_tokens"]).all()


# -- exercises -------------------------------------------------------------------------------


def test_slot_mapping_reference_follows_the_docstring_picture() -> None:
    # block_table.py's picture: block_size 4, table [7, 2, 5], 10 tokens.
    assert slot_mapping([7, 2, 5], 4, 0, 10) == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21]
    assert slot_mapping([3], 16, 5, 5) == []


def test_cached_prefix_reference_stops_at_the_first_miss_and_keeps_one_token() -> None:
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    h = chain_hashes(tokens, 2)
    cached = {h[0]: 10, h[1]: 11, h[3]: 13}
    assert engine_cached_prefix_blocks(tokens, 2, cached) == [10, 11]  # h[2] missing
    every = {hx: i for i, hx in enumerate(h)}
    assert engine_cached_prefix_blocks(tokens, 2, every) == [0, 1, 2]  # never the whole prompt
    assert engine_cached_prefix_blocks(tokens + [9], 2, every) == [0, 1, 2, 3]
    unchained = {hash_block_tokens(None, tokens[2:4]): 5, h[0]: 4}
    assert engine_cached_prefix_blocks(tokens, 2, unchained) == [4]


def test_prefill_chunks_reference_follows_the_scheduler_arithmetic() -> None:
    assert engine_prefill_chunks(900, 6, 64) == [58] * 15 + [30]
    assert engine_prefill_chunks(10, 0, 4) == [4, 4, 2]
    assert engine_prefill_chunks(5, 3, 4) == [1] * 5


def test_paged_vs_contiguous_runs_both_layouts_on_one_budget() -> None:
    prompts = sample_prompts(6, seed=3)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    runs = memory.paged_vs_contiguous(prompts, params, num_kv_blocks=10, model=MODEL, num_rounds=2)
    assert set(runs) == {"paged", "contiguous"} and all(len(rs) == 2 for rs in runs.values())
    paged, contiguous = runs["paged"][0], runs["contiguous"][0]
    # Contiguous: prompt + 40 slots each (prompts of 6-18 tokens) in 160 slots: 3 at once, never preempted.
    assert contiguous.max_running == 3 and max(contiguous.running) <= 3
    assert all(r.num_preemptions == 0 for r in runs["contiguous"])
    # Paged admits on the prompt's blocks alone: more at once, so the pool runs dry and it preempts.
    assert max(paged.running) > 3 and paged.num_preemptions >= 1
    assert paged.num_steps < contiguous.num_steps
    # Every request made all its tokens under both layouts.
    assert [len(t) for t in paged.token_ids] == [len(t) for t in contiguous.token_ids] == [40] * 6
    with pytest.raises(ValueError, match="not even one"):
        memory.paged_vs_contiguous(prompts, SamplingParams(max_tokens=500), num_kv_blocks=2, model=MODEL)
