"""Each build piece alone, on random inputs against the package's reference, before the engine.

Contract: `check_<piece>_alone(call)` takes the learner's function already adapted to the
core's signature (`build_pieces.get_adapter`), runs it on small random cases that cover every
branch of the piece's contract (flags on and off, edge values, several K/V heads with several
query heads each), compares with the package's own function (`pluggable.default`), and raises
`BuildFailure` naming the mistake in the learner's terms; it returns one line saying what was
checked.  The engine runs come after (`build_pieces`): a piece that is right alone and wrong in
the engine uses the seam wrongly; a piece wrong alone is told exactly where.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from minilm_engine import pluggable
from minilm_engine.course.teaching.build import BuildFailure

Fn = Callable[..., Any]


# -- grouped-query attention: which K/V head each query head read -------------------------------


def kv_heads_read(out: torch.Tensor, num_kv_heads: int) -> list[int | None]:
    """Given the output of an attention whose values are the constant j + 1 on K/V head j,
    (..., H, D): the K/V head each query head read (None where its output is not one constant,
    i.e. it mixed heads or is wrong in another way)."""
    heads = out.transpose(0, -2).reshape(out.shape[-2], -1).float()  # (H, everything else)
    read: list[int | None] = []
    for row in heads:
        c = row.mean().item()
        j = round(c) - 1
        ok = math.isfinite(c) and 0 <= j < num_kv_heads and torch.allclose(row, torch.full_like(row, j + 1), atol=1e-3)
        read.append(j if ok else None)
    return read


def require_gqa_mapping(read: list[int | None], num_kv_heads: int, where: str) -> None:
    """Raise naming the first query head that read the wrong K/V head."""
    num_heads = len(read)
    group = num_heads // num_kv_heads
    for h, j in enumerate(read):
        if j is not None and j != h // group:
            first = (h // group) * group
            raise BuildFailure(
                f"{where}: query head {h} read K/V head {j}; with {group} query heads per K/V head it should "
                f"read head {h // group} (query heads {first}..{first + group - 1} share K/V head {h // group}: "
                f"h // {group}, not h % {num_kv_heads}; repeat_interleave, not repeat)"
            )


# -- 02: append_and_attend -----------------------------------------------------------------------


def _attention_case(gen: torch.Generator, start: int, T: int, B: int = 2, H: int = 8, H_kv: int = 2,
                    D: int = 8, max_len: int = 12) -> dict[str, Any]:
    slots = torch.arange(start + T)
    query_slots = torch.arange(start, start + T)
    mask = (slots[None, None, :] <= query_slots[None, :, None]).expand(B, T, start + T).clone()
    if start > 0:
        mask[1, :, 0] = False  # row 1 is left-padded: its slot 0 holds no token
    return {
        "k_cache": torch.randn(B, H_kv, max_len, D, generator=gen),
        "v_cache": torch.randn(B, H_kv, max_len, D, generator=gen),
        "start": start,
        "q": torch.randn(B, T, H, D, generator=gen) * 2,
        "k": torch.randn(B, T, H_kv, D, generator=gen),
        "v": torch.randn(B, T, H_kv, D, generator=gen),
        "mask": mask,
    }


def _run(fn: Fn, case: dict[str, Any], **changes: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    c = {**case, **changes}
    k_cache, v_cache = c["k_cache"].clone(), c["v_cache"].clone()
    out = fn(k_cache, v_cache, c["start"], c["q"].clone(), c["k"].clone(), c["v"].clone(), c["mask"].clone())
    return out, k_cache, v_cache


def check_append_and_attend_alone(call: Fn) -> str:
    reference = pluggable.default("kv_cache.append_and_attend")
    gen = torch.Generator().manual_seed(2)
    cases = [(0, 5), (3, 4), (7, 1)]  # a whole prompt, a chunk after a prefix, one decode token
    for start, T in cases:
        case = _attention_case(gen, start, T)
        B, _, H, D = case["q"].shape
        H_kv = case["k"].shape[2]
        where = f"alone, start={start}, T={T}, {H} query heads over {H_kv} K/V heads"
        out, k_cache, v_cache = _run(call, case)
        want, _, _ = _run(reference, case)
        # 1. The cache: this step's keys and values in slots [start, start + T), earlier slots kept.
        for name, cache, new, old in (("k_cache", k_cache, case["k"], case["k_cache"]),
                                      ("v_cache", v_cache, case["v"], case["v_cache"])):
            if not torch.equal(cache[:, :, start : start + T], new.transpose(1, 2)):
                raise BuildFailure(
                    f"{where}: after your function, {name}[:, :, {start}:{start + T}] does not hold this step's "
                    f"{'keys' if name == 'k_cache' else 'values'} ((B, T, H_kv, D) transposed to (B, H_kv, T, D)); "
                    f"the next step attends over the cache, and what is not stored there it cannot see"
                )
            if not torch.equal(cache[:, :, :start], old[:, :, :start]):
                raise BuildFailure(f"{where}: your function changed {name}[:, :, :{start}], the earlier steps' slots")
        # 2. Which K/V head each query head reads: values constant j + 1 on K/V head j.
        probe_v_cache = (torch.arange(H_kv, dtype=torch.float32) + 1)[None, :, None, None].expand_as(case["v_cache"])
        probe_v = (torch.arange(H_kv, dtype=torch.float32) + 1)[None, None, :, None].expand_as(case["v"])
        probe, _, _ = _run(call, case, v_cache=probe_v_cache, v=probe_v)
        require_gqa_mapping(kv_heads_read(probe, H_kv), H_kv, where)
        # 3. The attention itself, and the usual slips named.
        if torch.allclose(out.float(), want, rtol=1e-4, atol=1e-5):
            continue
        if torch.allclose(out.float(), _run(reference, case, q=case["q"] * math.sqrt(D))[0], rtol=1e-4, atol=1e-5):
            raise BuildFailure(f"{where}: your scores are not divided by sqrt(head_dim) = sqrt({D})")
        if torch.allclose(out.float(), _run(reference, case, mask=torch.ones_like(case["mask"]))[0], rtol=1e-4, atol=1e-5):
            raise BuildFailure(f"{where}: your queries attend to slots where mask is False (later tokens, padding): "
                               f"set those scores to -inf before the softmax")
        b, t, h, _ = (int(i) for i in torch.unravel_index((out.float() - want).abs().argmax(), out.shape))
        raise BuildFailure(
            f"{where}: the output of row {b}, token {t}, query head {h} differs from the reference attention by "
            f"{(out[b, t, h].float() - want[b, t, h]).abs().max().item():.3g}"
        )
    return f"alone: {len(cases)} random cases (prompt, chunk after a prefix, decode; 8 query heads over 2 K/V heads) match"


# -- 04: the token budget ------------------------------------------------------------------------


def check_num_tokens_alone(call: Fn) -> str:
    reference = pluggable.default("scheduler.num_tokens_this_step")
    budget = 8
    num_cases = 0
    for chunked in (True, False):
        for scheduled in (0, 3, 7, 8):
            for remaining in (1, 4, 5, 6, 8, 12):
                want = reference(remaining, scheduled, budget, chunked)
                got = call(remaining, scheduled, budget, chunked)
                num_cases += 1
                if got == want:
                    continue
                left = budget - scheduled
                if want == remaining:
                    why = f"all {remaining} fit in the {left} left, so all run now"
                elif chunked:
                    why = ("with chunking on, a prompt that does not fit takes what is left of the budget "
                           "and comes back next step for the rest")
                else:
                    why = ("with chunking off, a prompt that does not fit whole waits for a step with room: "
                           "0 now, whatever is left")
                raise BuildFailure(
                    f"with enable_chunked_prefill={chunked}, a request with {remaining} tokens to compute, after "
                    f"{scheduled} of the {budget}-token budget are taken ({left} left): your function runs {got}, "
                    f"the reference {want} ({why})"
                )
    return f"alone: {num_cases} cases, chunked prefill on and off, budgets full, empty and exactly fitting"


# -- 06: quantizers within the error bound -------------------------------------------------------


def random_weight(gen: torch.Generator, N: int = 6, K: int = 64) -> torch.Tensor:
    """A weight with the shapes of trouble: an outlier row, a row of tiny values, a negative-only row."""
    w = torch.randn(N, K, generator=gen) * 0.05
    w[1, 7] = 1.5  # one outlier
    w[2] *= 1e-3  # a row far smaller than the others
    w[3] = -w[3].abs() - 0.01  # only negative values: an asymmetric range
    return w


def check_int8_alone(call: Fn) -> str:
    w = random_weight(torch.Generator().manual_seed(6))
    call(w, torch.float32)  # the adapter checks every weight is within half the row's step
    return "alone: a random weight (an outlier row, a tiny row, a negative row) within half a step everywhere"


def check_int4_alone(call: Fn) -> str:
    w = random_weight(torch.Generator().manual_seed(7), K=80)  # 80 = 2.5 groups of 32: a padded group
    call(w, 32, 1.0, torch.float32)
    return "alone: a random weight (an outlier, a tiny row, a negative row, a padded group) within half a step"


# -- 03: slot mapping and sharing a cached block ---------------------------------------------------


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def check_slot_mapping_alone(fn: Fn) -> str:
    """`fn(block_table, block_size, start, end)` (its answers' type checked) on random tables: ranges inside one block, across
    block boundaries, starting or ending on one, empty, of blocks of one token."""
    reference = pluggable.default("kv_cache.slot_mapping")
    gen = torch.Generator().manual_seed(3)
    cases = []
    for block_size in (4, 1, 16):
        table = torch.randperm(64, generator=gen)[:6].tolist()
        n = block_size * len(table)
        cases += [(table, block_size, 0, n), (table, block_size, 1, min(3, n)), (table, block_size, block_size, n),
                  (table, block_size, n // 2, n // 2), (table, block_size, n - 1, n)]
    for table, block_size, start, end in cases:
        got = fn(list(table), block_size, start, end)  # (checked: a list of end - start ints)
        want = reference(table, block_size, start, end)
        for pos, g, w in zip(range(start, end), got, want):
            if g != w:
                b, offset = pos // block_size, pos % block_size
                raise BuildFailure(
                    f"alone, block_table={table}, block_size={block_size}, positions [{start}, {end}): position {pos} "
                    f"is the {_ordinal(offset + 1)} token of the table's block {b} (block id {table[b]}), so its slot is "
                    f"{table[b]} * {block_size} + {offset} = {w}; your function gives {g}"
                )
    return f"alone: {len(cases)} random tables and ranges (across block boundaries, empty, blocks of 1 and 16) match"


def check_share_block_alone(call: Fn) -> str:
    """A block nobody holds (cached-free, in the middle of the free queue) and a block already held
    by two requests, each shared once: ref counts, the free queue and its order after."""
    from collections import OrderedDict

    from minilm_engine.core.block_pool import KVCacheBlock

    reference = pluggable.default("kv_cache.share_block")
    for ref_cnt, what in ((0, "a cached block nobody held (ref_cnt 0, in the free queue)"),
                          (2, "a block two requests already hold (ref_cnt 2, not in the free queue)")):
        states = []
        for fn in (call, reference):
            free = [KVCacheBlock(i, 0, None) for i in (4, 9, 2)]
            block = KVCacheBlock(7, ref_cnt, 1234)
            queue = OrderedDict((b.block_id, b) for b in (free[:2] + ([block] if ref_cnt == 0 else []) + free[2:]))
            fn(block, queue)
            states.append((block.ref_cnt, list(queue)))
        (got_cnt, got_queue), (want_cnt, want_queue) = states
        if got_cnt != want_cnt:
            raise BuildFailure(f"alone, {what}: after share_block its ref_cnt is {got_cnt}, expected {want_cnt}: "
                               f"the count is how many requests would be hurt if the block were reused")
        if 7 in got_queue:
            raise BuildFailure(f"alone, {what}: after share_block it is still in the free queue {got_queue}: the "
                               f"next allocation can take it and overwrite the KV its new holder reads")
        if got_queue != want_queue:
            raise BuildFailure(f"alone, {what}: the free queue is {got_queue} after share_block, expected "
                               f"{want_queue}: take out only the shared block, and keep the others' order (LRU)")
    return "alone: a cached-free block and a held block, shared once each: ref counts and the free queue right"


# -- 01: admission --------------------------------------------------------------------------------


def check_admits_alone(call: Fn) -> str:
    """Every combination of the decision's parts, with the edges: the last seat, no budget, the
    blocks needed exactly the blocks free, one more than free, a preemption earlier in the step."""
    from itertools import product

    from minilm_engine.core.schedule_step import AdmissionState

    reference = pluggable.default("scheduler.admits")
    num_cases = 0
    for num_running, num_new_tokens, (num_new_blocks, num_free_blocks), num_preempted in product(
            (0, 2, 3), (0, 1, 6), ((3, 4), (4, 4), (5, 4), (0, 0)), (0, 1)):
        state = AdmissionState(num_running=num_running, max_num_seqs=3, num_new_tokens=num_new_tokens,
                               num_new_blocks=num_new_blocks, num_free_blocks=num_free_blocks,
                               num_preempted=num_preempted)
        got, want = call(state), reference(state)
        num_cases += 1
        if got == want:
            continue
        if want:
            why = (f"it has a seat ({num_running} of 3 taken), {num_new_tokens} tokens in the budget, needs "
                   f"{num_new_blocks} blocks of the {num_free_blocks} free, and nobody was preempted this step")
        elif num_preempted:
            why = "a request was preempted earlier in this step: the pool is short, admit nobody (no thrashing)"
        elif num_running >= 3:
            why = f"every seat is taken ({num_running} running, max_num_seqs 3)"
        elif num_new_tokens == 0:
            why = "the step's token budget has no room for it (num_new_tokens is 0)"
        else:
            why = f"it needs {num_new_blocks} blocks and only {num_free_blocks} are free"
        raise BuildFailure(f"alone, {state}: your rule says {got}, the reference {want}: {why}")
    return f"alone: {num_cases} states (the last seat, no budget, blocks exactly enough and one short, after a preemption)"
