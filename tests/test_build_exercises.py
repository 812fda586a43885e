"""Build exercises (course/teaching/build.py): the learner's piece runs inside the real engine.

For every piece: a correct attempt written here (not the package's function) passes; the usual
wrong attempts each fail with their own message; the package's own function, passed directly
or called from inside the attempt, gets the nudge; an exception or a wrong type is reported,
never raised.  The engine runs on a tiny random checkpoint (conftest), a few requests long.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from minilm_engine import pluggable
from minilm_engine.core import kv_cache_utils as block_table
from minilm_engine.course.teaching import build
from minilm_engine.course.teaching.build_runs import BuildSetup, reference_run
from minilm_engine.core.schedule_step import admits as package_admits
from minilm_engine.course.teaching.build_pieces import CHUNK_ARGS, admit_args, preempt_args


@pytest.fixture(scope="module")
def setup(checkpoints) -> BuildSetup:
    return BuildSetup(model=str(checkpoints["qwen3"].path), draft_model=str(checkpoints["llama"].path),
                      max_tokens=6, num_samples=3000)


def assert_fails(result: build.BuildResult, *phrases: str) -> None:
    assert not result.passed, result
    for phrase in phrases:
        assert phrase in result.message, result


# -- correct attempts, written from the idea ---------------------------------------------------------


def my_slot_mapping(table, block_size, start, end):
    return [table[p // block_size] * block_size + p % block_size for p in range(start, end)]


def my_share_block(block, free_queue):
    if block.ref_cnt == 0:
        free_queue.pop(block.block_id)
    block.ref_cnt += 1


def my_victim(candidates):
    return candidates[-1]


def my_admits(state):
    if state.num_preempted:  # the pool just ran short: a newcomer would push someone out again
        return False
    has_seat = state.num_running < state.max_num_seqs
    return has_seat and state.num_new_tokens > 0 and state.num_new_blocks <= state.num_free_blocks


def my_num_tokens(remaining, scheduled, max_batched, chunked):
    left = max_batched - scheduled
    if remaining <= left:
        return remaining
    return left if chunked else 0


def my_append_and_attend(k_cache, v_cache, start, q, k, v, mask):
    T = q.shape[1]
    k_cache[:, :, start : start + T] = k.transpose(1, 2)
    v_cache[:, :, start : start + T] = v.transpose(1, 2)
    keys, values = k_cache[:, :, : start + T], v_cache[:, :, : start + T]  # (B, H_kv, S, D)
    group = q.shape[2] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = q.transpose(1, 2) @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return (scores.softmax(-1) @ values).transpose(1, 2)


def my_accept(drafts, p, q, generator):
    out = []
    for i, d in enumerate(drafts):
        if torch.rand((), generator=generator) < p[i, d] / q[i, d]:
            out.append(d)
            continue
        residual = (p[i] - q[i]).clamp(min=0)
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p[len(drafts)], 1, generator=generator)))
    return out


def my_int8(w):
    scales = w.abs().amax(dim=1) / 127
    return torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8), scales


def my_int4(w, group_size):
    N, K = w.shape
    groups = w.view(N, K // group_size, group_size)
    lo, hi = groups.amin(-1), groups.amax(-1)
    scales = (hi - lo) / 15
    codes = torch.round((groups - lo[..., None]) / scales[..., None]).clamp(0, 15)
    return codes.to(torch.uint8).view(N, K), scales, lo


def my_cached_prefix(block_hashes, cached_blocks):
    blocks = []
    for h in block_hashes:
        if h not in cached_blocks:
            break
        blocks.append(cached_blocks[h])
    return blocks


def my_take_free_blocks(num_blocks, free_queue, cached_blocks):
    taken = [free_queue.pop(block_id) for block_id in list(free_queue)[:num_blocks]]
    for block in taken:
        if block.block_hash is not None:
            cached_blocks.pop(block.block_hash)
            block.block_hash = None
        block.ref_cnt = 1
    return taken


def my_release_blocks(blocks, free_queue):
    for block in blocks:
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            free_queue[block.block_id] = block


def my_schedule_step(step, pool):
    """Written differently from the package's step: no admits / AdmissionState, the pool's
    allocate decides whether the head's blocks are there."""
    from minilm_engine.core.schedule_step import StepPlan

    plan, running, used = StepPlan(), list(step.running), 0
    i = 0
    while i < len(running):
        r, left = running[i], step.max_num_batched_tokens - used
        if r.num_remaining_tokens == 1 and r.num_spec_tokens:
            n = min(1 + r.num_spec_tokens, left)
        else:
            n = r.num_remaining_tokens if r.num_remaining_tokens <= left else left * step.enable_chunked_prefill
        if n == 0:
            i += 1
            continue
        while not pool.allocate(r.request_id, n):
            victim = running.pop()
            pool.preempt(victim.request_id)
            plan.preempted.append(victim.request_id)
            if victim is r:
                break
        if r in running:
            plan.num_new_tokens[r.request_id] = n
            used += n
            i += 1
    for w in step.waiting:
        left = step.max_num_batched_tokens - used
        todo = w.num_remaining_tokens - pool.num_cached_tokens(w.request_id)
        n = todo if todo <= left else left * step.enable_chunked_prefill
        if plan.preempted or len(running) == step.max_num_seqs or n == 0 or not pool.allocate(w.request_id, n):
            break
        running.append(w)
        plan.num_new_tokens[w.request_id] = n
        used += n
    return plan


CORRECT = {
    "append_and_attend": my_append_and_attend,
    "slot_mapping": my_slot_mapping,
    "share_block": my_share_block,
    "cached_prefix": my_cached_prefix,
    "take_free_blocks": my_take_free_blocks,
    "release_blocks": my_release_blocks,
    "preemption_victim": my_victim,
    "admits": my_admits,
    "schedule_step": my_schedule_step,
    "num_tokens_this_step": my_num_tokens,
    "accept_drafts": my_accept,
    "int8_weight": my_int8,
    "int4_weight": my_int4,
}


def test_every_piece_has_a_correct_attempt_here():
    assert list(CORRECT) == [n for n, p in build.pieces().items() if p.chapter != "A1"]


@pytest.mark.parametrize("piece", list(CORRECT))
def test_a_correct_attempt_passes(piece, setup):
    result = build.check(piece, CORRECT[piece], setup)
    assert result.passed, result
    assert any("ran" in d and "inside the engine" in d for d in result.details), result


# -- the package's own function -----------------------------------------------------------------


def test_the_package_function_gets_a_nudge_not_a_pass(setup):
    for fn in (block_table.slot_mapping, pluggable.default("kv_cache.slot_mapping")):
        assert_fails(build.check("slot_mapping", fn, setup), "package's own", "write it yourself")


@pytest.mark.parametrize("piece", ["append_and_attend", "num_tokens_this_step", "accept_drafts", "int8_weight",
                                   "int4_weight", "cached_prefix", "take_free_blocks", "release_blocks",
                                   "schedule_step", "admits", "preemption_victim", "share_block"])
def test_the_package_function_of_each_piece_gets_a_nudge(piece, setup):
    own = pluggable.default(build.get_piece(piece).registry_name)
    assert_fails(build.check(piece, own, setup), "package's own", "write it yourself")


def test_calling_the_package_function_inside_gets_a_nudge(setup):
    def wrapper(table, block_size, start, end):
        return block_table.slot_mapping(table, block_size, start, end)

    assert_fails(build.check("slot_mapping", wrapper, setup), "package's own", "your function calls it")


# -- the usual wrong attempts, each with its own message --------------------------------------------


def test_slot_mapping_off_by_one(setup):
    def off_by_one(table, block_size, start, end):
        return [table[p // block_size] * block_size + p % block_size + 1 for p in range(start, end)]

    result = build.check("slot_mapping", off_by_one, setup)
    assert not result.passed
    assert "token" in result.message or "engine failed" in result.message, result


def test_slot_mapping_forgetting_the_block_size(setup):
    def no_multiply(table, block_size, start, end):
        return [table[p // block_size] + p % block_size for p in range(start, end)]

    assert_fails(build.check("slot_mapping", no_multiply, setup), "position 0 is the 1st token of the table's block 0",
                 "so its slot is 42 * 4 + 0 = 168; your function gives 42")


def test_slot_mapping_wrong_type_and_length(setup):
    assert_fails(build.check("slot_mapping", lambda t, b, s, e: torch.arange(s, e), setup), "list of slot numbers")
    assert_fails(build.check("slot_mapping", lambda t, b, s, e: [0] * (e - s + 1), setup), "returned", "slots")
    assert_fails(build.check("slot_mapping", lambda t, b, s, e: [0.0] * (e - s), setup), "must be ints")


def test_an_exception_in_the_learners_code_is_reported(setup):
    def broken(table, block_size, start, end):
        return [table[p // 0] for p in range(start, end)]

    assert_fails(build.check("slot_mapping", broken, setup), "your function raised ZeroDivisionError", "line")
    assert_fails(build.check("slot_mapping", 42, setup), "expected a function")


def test_share_block_forgetting_the_refcount(setup):
    def no_refcount(block, free_queue):
        if block.ref_cnt == 0:
            free_queue.pop(block.block_id)

    assert_fails(build.check("share_block", no_refcount, setup), "ref_cnt")


def test_share_block_leaving_the_block_in_the_free_queue(setup):
    def stays_free(block, free_queue):
        block.ref_cnt += 1

    assert_fails(build.check("share_block", stays_free, setup), "still in the free queue",
                 "the next allocation can take it")


def test_share_block_reordering_the_free_queue(setup):
    def move_to_end(block, free_queue):
        if block.ref_cnt == 0:
            free_queue.pop(block.block_id)
            first = next(iter(free_queue))
            free_queue.move_to_end(first)  # the LRU order spoiled
        block.ref_cnt += 1

    assert_fails(build.check("share_block", move_to_end, setup), "keep the others' order (LRU)")


# -- the allocator: lookup, allocation with eviction, freeing ---------------------------------------


def test_the_allocator_workloads_hit_and_evict(setup):
    from minilm_engine.course.teaching.build_allocator import TIGHT_PAGED_ARGS
    from minilm_engine.course.teaching.build_runs import run_engine

    kinds = set()
    run_engine(setup, TIGHT_PAGED_ARGS, waves=2,
               observe=lambda llm, step: kinds.update(e.kind for e in llm.engine.trace.records[-1].block_events))
    assert {"shared", "evicted", "freed"} <= kinds, kinds


def test_cached_prefix_past_a_miss(setup):
    def skips_misses(block_hashes, cached_blocks):
        return [cached_blocks[h] for h in block_hashes if h in cached_blocks]

    assert_fails(build.check("cached_prefix", skips_misses, setup), "block 2's hash (103) is not cached",
                 "stop at the first miss")
    assert_fails(build.check("cached_prefix", lambda hashes, cached: [], setup), "take every leading block")
    assert_fails(build.check("cached_prefix", lambda hashes, cached: hashes, setup), "list of the cached blocks")


def test_take_free_blocks_usual_mistakes(setup):
    def from_the_tail(num_blocks, free_queue, cached_blocks):
        taken = [free_queue.pop(block_id) for block_id in list(free_queue)[::-1][:num_blocks]]
        for block in taken:
            if block.block_hash is not None:
                cached_blocks.pop(block.block_hash)
                block.block_hash = None
            block.ref_cnt = 1
        return taken

    def no_eviction(num_blocks, free_queue, cached_blocks):
        taken = [free_queue.pop(block_id) for block_id in list(free_queue)[:num_blocks]]
        for block in taken:
            block.ref_cnt = 1
        return taken

    def hash_left_in_the_cache(num_blocks, free_queue, cached_blocks):
        taken = no_eviction(num_blocks, free_queue, cached_blocks)
        for block in taken:
            block.block_hash = None
        return taken

    def no_refcount(num_blocks, free_queue, cached_blocks):
        taken = my_take_free_blocks(num_blocks, free_queue, cached_blocks)
        for block in taken:
            block.ref_cnt = 0
        return taken

    assert_fails(build.check("take_free_blocks", from_the_tail, setup), "took blocks [1]", "(LRU)")
    assert_fails(build.check("take_free_blocks", no_eviction, setup), "block 5 held the cached prefix 55", "evict it")
    assert_fails(build.check("take_free_blocks", hash_left_in_the_cache, setup), "cached_blocks still maps 55")
    assert_fails(build.check("take_free_blocks", no_refcount, setup), "ref_cnt 0 after allocation, expected 1")
    assert_fails(build.check("take_free_blocks", lambda n, q, c: [], setup), "your function returned 0")


def test_release_blocks_usual_mistakes(setup):
    def frees_shared_blocks(blocks, free_queue):
        for block in blocks:
            block.ref_cnt = max(block.ref_cnt - 1, 0)
            free_queue[block.block_id] = block

    def to_the_head(blocks, free_queue):
        my_release_blocks(blocks, free_queue)
        for block in reversed(blocks):
            if block.ref_cnt == 0:
                free_queue.move_to_end(block.block_id, last=False)

    def drops_the_hash(blocks, free_queue):
        my_release_blocks(blocks, free_queue)
        for block in blocks:
            if block.ref_cnt == 0:
                block.block_hash = None

    def forgets_the_count(blocks, free_queue):
        for block in blocks:
            free_queue[block.block_id] = block

    assert_fails(build.check("release_blocks", frees_shared_blocks, setup), "block 2 joined the free queue",
                 "another request still holds it")
    assert_fails(build.check("release_blocks", to_the_head, setup), "expected [4, 9, 7]", "join the tail")
    assert_fails(build.check("release_blocks", drops_the_hash, setup), "lost its cached prefix")
    assert_fails(build.check("release_blocks", forgets_the_count, setup), "each block loses one holder")


def test_the_preemption_workload_preempts(setup):
    assert sum(map(len, reference_run(setup, preempt_args(setup)).preempted)) >= 2


def test_preempting_the_oldest_is_caught(setup):
    assert_fails(build.check("preemption_victim", lambda c: c[0], setup), "preempt", "newer request")


def test_preemption_victim_wrong_answers(setup):
    assert_fails(build.check("preemption_victim", lambda c: len(c) - 1, setup), "not an index")
    assert_fails(build.check("preemption_victim", lambda c: None, setup), "not one of the candidates")


def test_the_admission_workloads_bind_seats_budget_and_blocks(setup):
    roomy, tight = admit_args(setup)
    want = reference_run(setup, roomy)
    assert max(len(step) for step in want.schedule) == roomy["max_num_seqs"] < len(setup.prompts)
    assert sum(map(len, reference_run(setup, tight).preempted)) >= 1


def _admits_without(part):
    def rule(s):
        checks = {"seats": s.num_running < s.max_num_seqs, "budget": s.num_new_tokens > 0,
                  "blocks": s.num_new_blocks <= s.num_free_blocks, "preempted": s.num_preempted == 0}
        return all(ok for name, ok in checks.items() if name != part)

    return rule


@pytest.mark.parametrize(
    "part, phrases",
    [
        ("seats", ["your rule says True, the reference False", "every seat is taken (3 running, max_num_seqs 3)"]),
        ("budget", ["your rule says True, the reference False", "num_new_tokens is 0"]),
        ("blocks", ["your rule says True, the reference False", "it needs 5 blocks and only 4 are free"]),
        ("preempted", ["preempted earlier in this step", "thrashing"]),
    ],
)
def test_admission_ignoring_one_limit_names_it(part, phrases, setup):
    assert_fails(build.check("admits", _admits_without(part), setup), *phrases)


def test_admission_that_never_admits_or_admits_one_at_a_time(setup):
    assert_fails(build.check("admits", lambda s: False, setup), "your rule says False, the reference True", "has a seat")
    one_at_a_time = lambda s: s.num_running == 0 and my_admits(s)  # noqa: E731
    assert_fails(build.check("admits", one_at_a_time, setup), "your rule says False", "(2 of 3 taken)")


def test_admission_refusing_an_exact_fit_of_blocks(setup):
    strict = lambda s: my_admits(s) and s.num_new_blocks < s.num_free_blocks  # noqa: E731
    assert_fails(build.check("admits", strict, setup), "your rule says False, the reference True",
                 "needs 4 blocks of the 4 free")


def test_admission_wrong_type_and_the_package_function(setup):
    assert_fails(build.check("admits", lambda s: None, setup), "True (the head starts) or False")
    assert_fails(build.check("admits", package_admits, setup), "package's own")
    assert_fails(build.check("admits", lambda s: package_admits(s), setup), "your function calls it")


def test_the_chunk_workload_chunks(setup):
    want = reference_run(setup, CHUNK_ARGS)
    assert any(n == CHUNK_ARGS["max_num_batched_tokens"] for step in want.schedule for _, n in step)
    assert any(len(step) > 1 for step in want.schedule)  # prefill chunks beside decodes


def test_chunk_budget_both_flag_values_run_in_the_engine(setup):
    result = build.check("num_tokens_this_step", my_num_tokens, setup)
    assert result.passed, result
    assert any("enable_chunked_prefill=True" in d for d in result.details), result
    assert any("enable_chunked_prefill=False" in d for d in result.details), result
    assert sum(map(len, reference_run(setup, admit_args(setup)[0]).schedule)) > 0


def test_chunk_budget_ignoring_running_decodes(setup):
    def per_request(remaining, scheduled, max_batched, chunked):
        return min(remaining, max_batched)

    assert_fails(build.check("num_tokens_this_step", per_request, setup), "after 3 of the 8-token budget are taken",
                 "the reference 5")


def test_chunk_budget_ignoring_the_flag(setup):
    # The mistake the engine runs alone never showed: every workload ran with chunking on.
    def always_chunk(remaining, scheduled, max_batched, chunked):
        return min(remaining, max_batched - scheduled)

    assert_fails(build.check("num_tokens_this_step", always_chunk, setup), "enable_chunked_prefill=False",
                 "with chunking off, a prompt that does not fit whole waits")


def test_chunk_budget_without_chunking(setup):
    def never_chunk(remaining, scheduled, max_batched, chunked):
        return remaining if remaining <= max_batched - scheduled else 0

    assert_fails(build.check("num_tokens_this_step", never_chunk, setup), "enable_chunked_prefill=True",
                 "with chunking on, a prompt that does not fit takes what is left")


def test_chunk_budget_one_short(setup):
    def one_short(remaining, scheduled, max_batched, chunked):
        left = max_batched - scheduled
        return remaining if remaining <= left else max(left - 1, 0)

    assert_fails(build.check("num_tokens_this_step", one_short, setup), "enable_chunked_prefill=True",
                 "your function runs 7, the reference 8")


def test_chunk_budget_refusing_an_exact_fit(setup):
    def strict(remaining, scheduled, max_batched, chunked):
        left = max_batched - scheduled
        return remaining if remaining < left else (left if chunked else 0)

    assert_fails(build.check("num_tokens_this_step", strict, setup), "enable_chunked_prefill=False",
                 "all 8 fit in the 8 left")


def test_chunk_budget_out_of_range(setup):
    assert_fails(build.check("num_tokens_this_step", lambda r, s, m, c: r + 1, setup), "tokens left to compute")


def test_append_and_attend_forgetting_the_cache(setup):
    def no_cache(k_cache, v_cache, start, q, k, v, mask):
        T = q.shape[1]
        out = my_append_and_attend(k_cache.clone(), v_cache.clone(), start, q, k, v, mask)
        return out if start == 0 else my_append_and_attend(torch.zeros_like(k_cache), torch.zeros_like(v_cache),
                                                           start, q, k, v, mask[..., : start + T])

    assert_fails(build.check("append_and_attend", no_cache, setup), "k_cache[:, :, 0:5] does not hold this step's keys")


def test_append_and_attend_without_the_scale(setup):
    def unscaled(k_cache, v_cache, start, q, k, v, mask):
        return my_append_and_attend(k_cache, v_cache, start, q * math.sqrt(q.shape[-1]), k, v, mask)

    def half_scaled(k_cache, v_cache, start, q, k, v, mask):
        return my_append_and_attend(k_cache, v_cache, start, q * math.sqrt(q.shape[-1]) * 0.5, k, v, mask)

    assert_fails(build.check("append_and_attend", unscaled, setup), "not divided by sqrt(head_dim)")
    assert_fails(build.check("append_and_attend", half_scaled, setup), "differs from the reference attention")


def test_append_and_attend_ignoring_the_mask(setup):
    def unmasked(k_cache, v_cache, start, q, k, v, mask):
        return my_append_and_attend(k_cache, v_cache, start, q, k, v, torch.ones_like(mask))

    assert_fails(build.check("append_and_attend", unmasked, setup), "mask is False", "-inf")


def test_append_and_attend_wrong_kv_head_for_a_query_head(setup):
    # repeat tiles the K/V heads (0 1 0 1 ...): query head h reads h % H_kv, not h // group.
    def tiled(k_cache, v_cache, start, q, k, v, mask):
        T = q.shape[1]
        k_cache[:, :, start : start + T] = k.transpose(1, 2)
        v_cache[:, :, start : start + T] = v.transpose(1, 2)
        group = q.shape[2] // k_cache.shape[1]
        keys = k_cache[:, :, : start + T].repeat(1, group, 1, 1)
        values = v_cache[:, :, : start + T].repeat(1, group, 1, 1)
        scores = q.transpose(1, 2) @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
        return (scores.softmax(-1) @ values).transpose(1, 2)

    assert_fails(build.check("append_and_attend", tiled, setup),
                 "query head 1 read K/V head 1; with 4 query heads per K/V head it should read head 0")


def test_the_engine_check_runs_a_model_with_several_kv_heads(setup):
    from minilm_engine.model.loader import resolve_model_path
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(resolve_model_path(setup.model))
    assert config.num_key_value_heads > 1 and config.num_attention_heads // config.num_key_value_heads > 1


def test_append_and_attend_wrong_shape(setup):
    def heads_first(k_cache, v_cache, start, q, k, v, mask):
        return my_append_and_attend(k_cache, v_cache, start, q, k, v, mask).transpose(1, 2)

    assert_fails(build.check("append_and_attend", heads_first, setup), "q's shape")


def accept_rule(accept, resample="residual", bonus=True, bonus_from="p[k]"):
    def rule(drafts, p, q, generator):
        out = []
        for i, d in enumerate(drafts):
            if torch.rand((), generator=generator) < accept(p[i, d], q[i, d]):
                out.append(d)
                continue
            dist = (p[i] - q[i]).clamp(min=0) if resample == "residual" else p[i]
            out.append(int(torch.multinomial(dist / dist.sum(), 1, generator=generator)))
            return out
        if bonus:
            row = {"p[k]": p[len(drafts)], "p[k-1]": p[len(drafts) - 1], "q[k-1]": q[len(drafts) - 1]}[bonus_from]
            out.append(int(torch.multinomial(row, 1, generator=generator)))
        return out

    return rule


@pytest.mark.parametrize(
    "rule",
    [
        accept_rule(lambda p, q: p),  # forgot to divide by the draft's probability
        accept_rule(lambda p, q: min(1.0, float(q / p))),  # the ratio upside down
        accept_rule(lambda p, q: 1.0),  # always accept: the output is the draft's
        accept_rule(lambda p, q: min(1.0, float(p / q)), resample="target"),  # resample from p, not max(p - q, 0)
    ],
    ids=["p", "q_over_p", "always", "resample_from_p"],
)
def test_wrong_accept_rules_fail_the_distribution_test(rule, setup):
    assert_fails(build.check("accept_drafts", rule, setup), "not distributed as the target's", "chi-square")


@pytest.mark.parametrize("bonus_from, fits", [("p[k-1]", "p[1]"), ("q[k-1]", "q[1]")])
def test_accept_rule_bonus_token_from_the_wrong_row(bonus_from, fits, setup):
    # Only the bonus token is wrong: the first tokens pass their tests, the bonus position does not.
    rule = accept_rule(lambda p, q: min(1.0, float(p / q)), bonus_from=bonus_from)
    assert_fails(build.check("accept_drafts", rule, setup), "bonus token (after all 2 drafts were accepted)",
                 "row p[2]", f"they fit {fits} instead")


def test_accept_rule_every_position_is_tested(setup):
    result = build.check("accept_drafts", my_accept, setup)
    assert result.passed, result
    for what in ("first appended token", "token at position 1", "bonus token"):
        assert what in result.details[0], result


def test_accept_rule_without_the_bonus_token(setup):
    rule = accept_rule(lambda p, q: min(1.0, float(p / q)), bonus=False)
    assert_fails(build.check("accept_drafts", rule, setup), "bonus token")


def test_accept_rule_min_is_optional_since_u_is_below_one(setup):
    # u < p/q and u < min(1, p/q) agree for every u in [0, 1): both are the right rule.
    assert build.check("accept_drafts", accept_rule(lambda p, q: p / q), setup).passed


def test_int8_per_tensor(setup):
    def per_tensor(w):
        scale = w.abs().max() / 127
        return torch.round(w / scale).to(torch.int8), scale.expand(w.shape[0]).clone()

    assert_fails(build.check("int8_weight", per_tensor, setup), "per-tensor")
    assert_fails(build.check("int8_weight", lambda w: (my_int8(w)[0], w.abs().max() / 127), setup), "per tensor")


def test_int8_wrong_step_and_truncation(setup):
    def over_128(w):
        scales = w.abs().amax(dim=1) / 128
        return torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8), scales

    def truncating(w):
        codes, scales = my_int8(w)
        return torch.trunc(w / scales[:, None]).to(torch.int8), scales

    assert_fails(build.check("int8_weight", over_128, setup), "your scale is", "127")
    assert_fails(build.check("int8_weight", truncating, setup), "half a step")


def test_int4_symmetric_and_per_tensor(setup):
    def symmetric(w, group_size):
        N, K = w.shape
        groups = w.view(N, K // group_size, group_size)
        scales = groups.abs().amax(-1) / 7.5
        codes = torch.round(groups / scales[..., None] + 7.5).clamp(0, 15)
        return codes.to(torch.uint8).view(N, K), scales, -7.5 * scales

    def per_row(w, group_size):
        N, K = w.shape
        lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
        scales = ((hi - lo) / 15).expand(N, K // group_size).contiguous()
        codes = torch.round((w - lo) / scales[:, :1]).clamp(0, 15)
        return codes.to(torch.uint8), scales, lo.expand(N, K // group_size).contiguous()

    assert_fails(build.check("int4_weight", symmetric, setup), "your scale is", "expected at most")
    assert_fails(build.check("int4_weight", per_row, setup), "your scale is", "expected at most")


def test_int4_with_a_zero_point_passes(setup):
    # A right answer that is not the package's recipe: codes shifted by an integer zero point,
    # so w ~ (codes - zero) * scale; every weight is still within half of its group's step.
    def zero_point(w, group_size):
        N, K = w.shape
        groups = w.view(N, K // group_size, group_size)
        lo, hi = groups.amin(-1), groups.amax(-1)
        scales = (hi - lo) / 15
        zero = torch.round(-lo / scales)
        codes = (torch.round(groups / scales[..., None]) + zero[..., None]).clamp(0, 15)
        return codes.to(torch.uint8).view(N, K), scales, -zero * scales

    result = build.check("int4_weight", zero_point, setup)
    assert result.passed, result
    assert result.details[0].startswith("alone:"), result


def test_int8_with_float16_scales_passes(setup):
    def half_scales(w):
        scales = (w.abs().amax(dim=1) / 127).half()
        return torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8), scales

    assert build.check("int8_weight", half_scales, setup).passed


def test_int8_codes_of_minus_128(setup):
    def asymmetric_range(w):
        codes, scales = my_int8(w)
        return torch.where(codes == -127, torch.full_like(codes, -128), codes), scales

    assert_fails(build.check("int8_weight", asymmetric_range, setup), "-127..127")


# -- the whole engine at once ---------------------------------------------------------------------


def test_check_all_runs_every_piece_at_once(setup):
    result = build.check_all(CORRECT, setup)
    assert result.passed, result
    partial = build.check_all({"slot_mapping": my_slot_mapping}, setup)
    assert not partial.passed and "still the package's own" in partial.message


def test_check_all_names_the_broken_piece(setup):
    pieces = dict(CORRECT, share_block=lambda block, free_queue: None)
    assert_fails(build.check_all(pieces, setup), "ref_cnt")


def test_swap_in_leaves_the_engine_as_it_was():
    from minilm_engine.worker.block_table import BlockTable

    table = BlockTable.of([[3], [5, 1]], 4)
    rows, starts, ends = np.array([0, 1]), np.array([0, 3]), np.array([2, 5])
    with build.swap_in("slot_mapping", my_slot_mapping):
        assert table.slot_mapping(rows, starts, ends).tolist() == [12, 13, 23, 4]
    assert pluggable.num_calls("kv_cache.slot_mapping") == 2  # once per request
    assert table.slot_mapping(rows, starts, ends).tolist() == [12, 13, 23, 4]  # the package's own again
    with pytest.raises(KeyError, match="no build piece"):
        with build.swap_in("nope", my_slot_mapping):
            pass


# -- A1: the decode kernel's online softmax, under the Triton interpreter ---------------------------

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _decode_body(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
    stride_q_token, stride_q_head, stride_out_token, stride_out_head,
    stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
    block_size, num_queries_per_kv, head_dim,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MODE: tl.constexpr,
):
    # MODE 0: right; 1: the rescale forgotten; 2: zeros stored; 3: query heads strided over K/V heads;
    # 4: the output never stored; 5: a cached row found with the head's stride instead of the row's.
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    context_len = tl.load(context_lens_ptr + seq)
    group = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    heads = kv_head * num_queries_per_kv + group
    if MODE == 3:
        heads = kv_head + group * (tl.num_programs(1))  # query head h reads K/V head h % H_kv
    mask_g, mask_d = group < num_queries_per_kv, dims < head_dim
    q_mask = mask_g[:, None] & mask_d[None, :]
    q = tl.load(q_ptr + seq * stride_q_token + heads[:, None] * stride_q_head + dims[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32)
    best = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK_G], dtype=tl.float32)
    weighted = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    positions = tl.arange(0, BLOCK_N)
    for start in range(0, context_len, BLOCK_N):
        pos = start + positions
        mask_n = pos < context_len
        block = tl.load(block_tables_ptr + seq * stride_table_seq + pos // block_size, mask=mask_n, other=0)
        row = block * stride_cache_block + (pos % block_size) * stride_cache_row + kv_head * stride_cache_head
        if MODE == 5:
            row = block * stride_cache_block + (pos % block_size) * stride_cache_head + kv_head * stride_cache_head
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + row[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + row[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        s = tl.where(mask_n[None, :], s, float("-inf"))
        new_best = tl.maximum(best, tl.max(s, axis=1))
        shrink = tl.exp(best - new_best)
        if MODE == 1:
            shrink = shrink * 0.0 + 1.0  # the usual slip: old sums kept against the old maximum
        e = tl.exp(s - new_best[:, None])
        total = total * shrink + tl.sum(e, axis=1)
        weighted = weighted * shrink[:, None] + tl.sum(e[:, :, None] * v[None, :, :], axis=1)
        best = new_best
    out = weighted / total[:, None]
    if MODE == 2:
        out = out * 0.0
    offset = seq * stride_out_token + heads[:, None] * stride_out_head + dims[None, :]
    if MODE != 4:
        tl.store(out_ptr + offset, out.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def my_decode_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
    stride_q_token, stride_q_head, stride_out_token, stride_out_head,
    stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
    block_size, num_queries_per_kv, head_dim,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    _decode_body(out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
                 stride_q_token, stride_q_head, stride_out_token, stride_out_head,
                 stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
                 block_size, num_queries_per_kv, head_dim, BLOCK_G, BLOCK_N, BLOCK_D, 0)


@triton.jit
def no_rescale_decode_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
    stride_q_token, stride_q_head, stride_out_token, stride_out_head,
    stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
    block_size, num_queries_per_kv, head_dim,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    _decode_body(out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
                 stride_q_token, stride_q_head, stride_out_token, stride_out_head,
                 stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
                 block_size, num_queries_per_kv, head_dim, BLOCK_G, BLOCK_N, BLOCK_D, 1)


@triton.jit
def zeros_decode_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
    stride_q_token, stride_q_head, stride_out_token, stride_out_head,
    stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
    block_size, num_queries_per_kv, head_dim,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    _decode_body(out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
                 stride_q_token, stride_q_head, stride_out_token, stride_out_head,
                 stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
                 block_size, num_queries_per_kv, head_dim, BLOCK_G, BLOCK_N, BLOCK_D, 2)


@triton.jit
def strided_heads_decode_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
    stride_q_token, stride_q_head, stride_out_token, stride_out_head,
    stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
    block_size, num_queries_per_kv, head_dim,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    _decode_body(out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
                 stride_q_token, stride_q_head, stride_out_token, stride_out_head,
                 stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
                 block_size, num_queries_per_kv, head_dim, BLOCK_G, BLOCK_N, BLOCK_D, 3)


@triton.jit
def never_stored_decode_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
    stride_q_token, stride_q_head, stride_out_token, stride_out_head,
    stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
    block_size, num_queries_per_kv, head_dim,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    _decode_body(out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
                 stride_q_token, stride_q_head, stride_out_token, stride_out_head,
                 stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
                 block_size, num_queries_per_kv, head_dim, BLOCK_G, BLOCK_N, BLOCK_D, 4)


@triton.jit
def wrong_stride_decode_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
    stride_q_token, stride_q_head, stride_out_token, stride_out_head,
    stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
    block_size, num_queries_per_kv, head_dim,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    _decode_body(out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, scale,
                 stride_q_token, stride_q_head, stride_out_token, stride_out_head,
                 stride_cache_block, stride_cache_row, stride_cache_head, stride_table_seq,
                 block_size, num_queries_per_kv, head_dim, BLOCK_G, BLOCK_N, BLOCK_D, 5)


@pytest.fixture(scope="module")
def interpreted():
    from minilm_engine.model.attention.triton_paged_prefill import is_interpreted

    if not is_interpreted() and not torch.cuda.is_available():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 (see conftest.py)")


@pytest.fixture(scope="module")
def kernel_setup(setup) -> BuildSetup:
    # Two prompts longer than a key tile (16), three tokens each: the interpreter is slow.
    return BuildSetup(model=setup.model, prompts=setup.prompts[:2], max_tokens=3)


@pytest.mark.slow  # the interpreter runs every program instance in Python: ~1-2 min on 2 busy cores
def test_decode_kernel_correct_passes(kernel_setup, interpreted):
    result = build.check("decode_kernel", my_decode_kernel, kernel_setup)
    assert result.passed, result
    assert "matches the reference attention" in result.details[0], result


def test_decode_kernel_alone_on_a_random_paged_batch(interpreted):
    # Seconds, not minutes: the kernel alone against the reference, before any engine runs.
    from minilm_engine.course.teaching.build_kernels import check_kernel_alone

    assert "matches the reference attention" in check_kernel_alone(my_decode_kernel)


@pytest.mark.parametrize(
    "kernel, phrases",
    [
        ("no_rescale", ["fit in one key tile", "must be rescaled by exp(m_old - m_new)"]),
        ("zeros", ["output is all zeros"]),  # the first tokens of a request used to come out right
        ("strided_heads", ["query head 1 read K/V head 1; with 4 query heads per K/V head it should read head 0"]),
        ("never_stored", ["never wrote its output"]),
        ("wrong_stride", ["read cache rows outside its sequence's context", "a wrong stride"]),
    ],
)
def test_decode_kernel_usual_mistakes_are_named(kernel, phrases, kernel_setup, interpreted):
    fn = {"no_rescale": no_rescale_decode_kernel, "zeros": zeros_decode_kernel,
          "strided_heads": strided_heads_decode_kernel, "never_stored": never_stored_decode_kernel,
          "wrong_stride": wrong_stride_decode_kernel}[kernel]
    assert_fails(build.check("decode_kernel", fn, kernel_setup), "alone, a random paged batch", *phrases)


def test_decode_kernel_package_kernel_and_wrong_type(setup, interpreted):
    from minilm_engine.model.attention.triton_paged_decode import paged_decode_kernel

    assert_fails(build.check("decode_kernel", paged_decode_kernel, setup), "package's own")
    assert_fails(build.check("decode_kernel", lambda: None, setup), "@triton.jit")
