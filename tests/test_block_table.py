"""Tests for worker/block_table.py's `BlockTable`: the runner's block tables kept between steps.

Its rows must always say what the block manager's tables say, whatever the engine does to them
(allocate, trim rejected drafts, preempt, finish, abort), and the step built from them must be
the step built from plain lists.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minilm_engine import LLM, SamplingParams
from minilm_engine.worker.block_table import BlockTable
from minilm_engine.core.kv_cache_utils import slot_mapping
from minilm_engine.worker.input_batch import Chunk, flatten_chunks


def test_rows_follow_updates_and_grow():
    table = BlockTable(max_num_reqs=1, max_num_blocks=2, block_size=4)
    assert table.update("a", 0, [7, 2]) == 0
    table.update("a", 2, [5])  # past the columns: they grow
    assert table.get_row("a") == [7, 2, 5]
    table.update("b", 0, [4])  # past the rows: they grow
    table.update("a", 1, [9])  # kept 1 (a trimmed table), then a new block
    assert table.get_row("a") == [7, 9] and table.get_row("b") == [4]
    table.remove("a")
    table.remove("nobody")  # ignored
    assert table.update("c", 0, [3]) == 0  # a's row is reused
    with pytest.raises(ValueError, match="first update must carry its whole table"):
        table.update("d", 1, [6])
    with pytest.raises(ValueError, match="cannot keep 2 blocks, its row holds 1"):
        table.update("c", 2, [6])


def test_slot_mapping_is_the_formula_and_refuses_positions_past_the_table():
    table = BlockTable(4, 4, block_size=3)
    table.update("a", 0, [7, 2, 5])
    table.update("b", 0, [1])
    rows, starts, ends = np.array([0, 1]), np.array([0, 0]), np.array([9, 3])
    expected = slot_mapping([7, 2, 5], 3, 0, 9) + slot_mapping([1], 3, 0, 3)
    assert table.slot_mapping(rows, starts, ends).tolist() == expected
    assert table.slot_mapping(np.array([0]), np.array([4]), np.array([6])).tolist() == slot_mapping([7, 2, 5], 3, 4, 6)
    with pytest.raises(ValueError, match="request 'b': position 3 lies past its 1 blocks of 3"):
        table.slot_mapping(np.array([1]), np.array([3]), np.array([4]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.lists(st.integers(0, 99), max_size=4)),
                max_size=40))
def test_rows_equal_a_dict_of_lists(ops):
    # Model: request -> list of block ids.  Op (r, k, new): k == 0 on a request without a row
    # adds it; k == 3 removes it; otherwise keep min(k, len) blocks and append `new`.
    table, model = BlockTable(2, 1, block_size=2), {}
    for r, k, new in ops:
        rid = f"r{r}"
        if k == 3:
            table.remove(rid)
            model.pop(rid, None)
            continue
        kept = 0 if rid not in model else min(k, len(model[rid]))
        table.update(rid, kept, new)
        model[rid] = model.get(rid, [])[:kept] + new
        assert {q: table.get_row(q) for q in model} == model
    assert len(set(table.row_of.values())) == len(table.row_of) == len(model)
    # A step's slots, computed for every row at once, are the reference's request by request.
    rids = [q for q in model if model[q]]
    rows = np.array([table.row_of[q] for q in rids], dtype=np.int64)
    ends = np.array([2 * len(model[q]) - len(q) % 2 for q in rids], dtype=np.int64)
    starts = ends // 3
    expected = [s for q, a, b in zip(rids, starts, ends)
                for s in slot_mapping(model[q], 2, int(a), int(b))]
    assert table.slot_mapping(rows, starts, ends).tolist() == expected


def test_a_step_from_the_table_equals_the_step_from_lists():
    tables = {"a": [3, 9], "b": [5, 1, 4], "c": [2]}
    table = BlockTable(2, 2, block_size=4)
    for rid, blocks in tables.items():
        table.update(rid, 0, blocks)
    steps = [("a", [11, 12, 13], 2), ("b", [14], 9), ("c", [15, 16], 0)]
    from_lists = flatten_chunks([Chunk(r, t, s, tables[r]) for r, t, s in steps], 4, torch.device("cpu"))
    from_table = flatten_chunks([Chunk(r, t, s) for r, t, s in steps], 4, torch.device("cpu"), table)
    for a, b in zip(from_lists[:2] + tuple(vars(from_lists[2]).values()),
                    from_table[:2] + tuple(vars(from_table[2]).values())):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    ids, positions, meta = from_table
    assert positions.tolist() == [2, 3, 4, 9, 0, 1]
    assert meta.slot_mapping.tolist() == [14, 15, 36, 17, 8, 9]
    assert meta.context_lens.tolist() == [5, 10, 2] and meta.query_start_loc.tolist() == [0, 3, 4, 6]
    assert meta.block_tables[1].tolist() == [5, 1, 4] and meta.max_query_len == 3


def check_rows_match_the_manager(engine) -> None:
    """After a step: every running request that ran has the manager's table as its row, and
    every row belongs to a running request or one whose release the next step will carry."""
    table, manager = engine.runner.block_table, engine.block_manager
    for rid in table.row_of:
        if rid in manager.block_tables and rid not in engine.scheduler._freed_request_ids:
            held = manager.get_block_table(rid)
            row = table.get_row(rid)
            # The manager may have trimmed rejected drafts since: the row's head is the table.
            assert row[: len(held)] == held and len(row) >= len(held)
    running = {r.request_id for r in engine.scheduler.running}
    assert set(table.row_of) <= running | set(engine.scheduler._freed_request_ids)


@pytest.mark.parametrize("speculate", [False, True], ids=["plain", "ngram-drafts"])
def test_engine_rows_follow_the_manager_under_preemption_and_drafts(checkpoints, prompts, speculate):
    # A small pool (preemption), a small budget (chunks), prefix hits, an abort, and with
    # n-gram drafts the trims of rejected ones: the rows stay the manager's tables, and the
    # tokens are those of an engine with room for everything.
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    extra = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}} if speculate else {}
    roomy = LLM(checkpoints["qwen3"].path, max_model_len=128, block_size=4, **extra)
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts * 2, params, use_tqdm=False)]
    llm = LLM(checkpoints["qwen3"].path, max_model_len=128, block_size=4, num_kv_blocks=18,
              max_num_seqs=4, max_num_batched_tokens=16, **extra)
    engine = llm.engine
    for i, prompt in enumerate(prompts * 2):
        engine.add_request(str(i), prompt, params)
    engine.add_request("aborted", prompts[2], params)
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
        if engine.num_steps == 3:
            engine.abort_request("aborted")
        check_rows_match_the_manager(engine)
        assert len(engine.runner.block_table.row_of) <= engine.config.max_num_seqs + len(
            engine.scheduler._freed_request_ids)
    assert engine.scheduler.num_preemptions > 0
    assert [outputs[str(i)] for i in range(len(prompts) * 2)] == expected
