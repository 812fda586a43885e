"""Tests for minilm_engine.model.attention.paged: paged attention equals dense causal attention.

The paged reference must give exactly what plain attention gives on contiguous tensors, whatever
the blocks look like.  Each random case draws:

    sequences    1 to 5, each with its own context length L (1 to 40 tokens)
    queries      T of the L tokens are new this step: T = 1 (decode), T = L (a whole prompt),
                 or 1 < T < L (a chunk after a cached prefix)
    blocks       block_size 1, 3, 4 or 16 (so contexts end mid-block and on boundaries);
                 block ids shuffled across the pool, so tables are neither sorted nor contiguous
    heads        H_kv in {1, 2}, H = H_kv * ratio with ratio (GQA) 1, 2 or 4

The cached prefix is written in one earlier "step", the new tokens in this one, as the engine
does.  Every slot nobody writes holds NaN: reading one would poison the output.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from minilm_engine.model.attention import attention, paged
from minilm_engine.model.attention import cpu_compiled as attention_cpu_compiled
from minilm_engine.model.attention.cpu import CpuBackend
from minilm_engine.model.attention.backends import TORCH_BACKEND, TorchBackend
from minilm_engine.model.attention.context import PagedAttention
from minilm_engine.model.attention.paged import (
    PagedAttentionMetadata,
    paged_attention_reference,
    write_kv_reference,
)

BLOCK_SIZES = [1, 3, 4, 16]
GQA_RATIOS = [1, 2, 4]


@dataclass
class PagedSeq:
    """One sequence of a paged step: its dense K/V, queries and block table."""

    keys: torch.Tensor  # (L, H_kv, D)
    values: torch.Tensor  # (L, H_kv, D)
    queries: torch.Tensor  # (T, H, D), the last T tokens
    block_table: list[int]

    @property
    def context_len(self) -> int:
        return self.keys.shape[0]

    @property
    def num_queries(self) -> int:
        return self.queries.shape[0]


def slots(block_table: list[int], block_size: int, start: int, end: int) -> list[int]:
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]


def random_case(rng: random.Random, ratio: int, block_size: int, dtype=torch.float32):
    """Random sequences, a NaN-filled cache with a shuffled block layout."""
    num_kv_heads, head_dim = rng.choice([1, 2]), rng.choice([4, 8])
    num_heads = num_kv_heads * ratio
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    shapes = []
    for _ in range(rng.randint(1, 5)):
        context_len = rng.randint(1, 40)
        kind = rng.choice(["decode", "prompt", "chunk"])
        num_queries = {"decode": 1, "prompt": context_len, "chunk": rng.randint(1, context_len)}[
            kind
        ]
        shapes.append((context_len, num_queries))
    blocks_needed = [-(-length // block_size) for length, _ in shapes]
    num_blocks = sum(blocks_needed) + rng.randint(0, 3)  # some blocks nobody uses
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    seqs = []
    for (context_len, num_queries), n in zip(shapes, blocks_needed):
        table, ids = ids[:n], ids[n:]
        seqs.append(
            PagedSeq(
                keys=torch.randn(context_len, num_kv_heads, head_dim, generator=gen, dtype=dtype),
                values=torch.randn(context_len, num_kv_heads, head_dim, generator=gen, dtype=dtype),
                queries=torch.randn(num_queries, num_heads, head_dim, generator=gen, dtype=dtype),
                block_table=table,
            )
        )
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    return seqs, k_cache, v_cache


def write_prefix(seqs: list[PagedSeq], k_cache, v_cache, rng: random.Random) -> None:
    """An earlier step: every cached (not new) token of every sequence, in shuffled order."""
    block_size = k_cache.shape[1]
    rows = [
        (seq.keys[p], seq.values[p], slots(seq.block_table, block_size, p, p + 1)[0])
        for seq in seqs
        for p in range(seq.context_len - seq.num_queries)
    ]
    if not rows:
        return
    rng.shuffle(rows)
    k, v, slot = zip(*rows)
    write_kv_reference(k_cache, v_cache, torch.stack(k), torch.stack(v), torch.tensor(slot))


def this_step(seqs: list[PagedSeq], block_size: int):
    """Flattened q/k/v of the new tokens and their metadata, the way ModelRunner builds them."""
    q = torch.cat([s.queries for s in seqs])  # (N, H, D)
    k = torch.cat([s.keys[s.context_len - s.num_queries :] for s in seqs])  # (N, H_kv, D)
    v = torch.cat([s.values[s.context_len - s.num_queries :] for s in seqs])
    slot_mapping = [
        slot
        for s in seqs
        for slot in slots(s.block_table, block_size, s.context_len - s.num_queries, s.context_len)
    ]
    query_start_loc = [0]
    for s in seqs:
        query_start_loc.append(query_start_loc[-1] + s.num_queries)
    width = max(len(s.block_table) for s in seqs)
    meta = PagedAttentionMetadata(
        slot_mapping=torch.tensor(slot_mapping),
        query_start_loc=torch.tensor(query_start_loc),
        context_lens=torch.tensor([s.context_len for s in seqs]),
        block_tables=torch.tensor(
            [s.block_table + [0] * (width - len(s.block_table)) for s in seqs]
        ),
    )
    return q, k, v, meta


def dense_causal(seq: PagedSeq) -> torch.Tensor:
    """Plain attention on contiguous K/V: query i (at position L - T + i) sees keys 0..itself."""
    context_len, num_queries = seq.context_len, seq.num_queries
    query_pos = torch.arange(context_len - num_queries, context_len)
    mask = torch.arange(context_len)[None, :] <= query_pos[:, None]  # (T, L)
    out = attention(
        seq.queries.transpose(0, 1)[None],  # (1, H, T, D)
        seq.keys.transpose(0, 1)[None],  # (1, H_kv, L, D)
        seq.values.transpose(0, 1)[None],
        mask[None],
    )
    return out[0].transpose(0, 1)  # (T, H, D)


# ---------------------------------------------------------------------- the dense reference itself
@pytest.mark.parametrize("ratio", GQA_RATIOS)
def test_dense_reference_matches_torch_sdpa(ratio):
    # The yardstick below is `attention`; make sure it is causal attention as torch computes it.
    gen = torch.Generator().manual_seed(ratio)
    q = torch.randn(2, 2 * ratio, 7, 8, generator=gen)
    k, v = torch.randn(2, 2, 2, 7, 8, generator=gen)
    mask = torch.ones(7, 7, dtype=torch.bool).tril()[None].expand(2, 7, 7)
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(ratio, 1), v.repeat_interleave(ratio, 1), is_causal=True
    )
    torch.testing.assert_close(attention(q, k, v, mask), expected)


# ---------------------------------------------------------------------- write_kv_reference
@pytest.mark.parametrize("seed", range(10))
def test_write_kv_puts_each_token_in_its_slot(seed):
    rng = random.Random(seed)
    block_size = rng.choice(BLOCK_SIZES)
    seqs, k_cache, v_cache = random_case(rng, ratio=1, block_size=block_size)
    write_prefix(seqs, k_cache, v_cache, rng)
    _, k, v, meta = this_step(seqs, block_size)
    write_kv_reference(k_cache, v_cache, k, v, meta.slot_mapping)
    written = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for s in seqs:
        for p in range(s.context_len):
            block, offset = s.block_table[p // block_size], p % block_size
            torch.testing.assert_close(k_cache[block, offset], s.keys[p], rtol=0, atol=0)
            torch.testing.assert_close(v_cache[block, offset], s.values[p], rtol=0, atol=0)
            written[block, offset] = True
    # Nothing else was touched: every other slot still holds NaN.
    assert torch.isnan(k_cache[~written]).all() and torch.isnan(v_cache[~written]).all()
    assert not torch.isnan(k_cache[written]).any()


# ---------------------------------------------------------------------- paged == dense
@pytest.mark.parametrize("ratio", GQA_RATIOS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("seed", range(6))
def test_paged_attention_matches_dense(seed, block_size, ratio):
    rng = random.Random(seed * 1000 + block_size * 10 + ratio)
    seqs, k_cache, v_cache = random_case(rng, ratio, block_size)
    write_prefix(seqs, k_cache, v_cache, rng)
    q, k, v, meta = this_step(seqs, block_size)
    write_kv_reference(k_cache, v_cache, k, v, meta.slot_mapping)
    out = paged_attention_reference(q, k_cache, v_cache, meta)
    assert out.shape == q.shape
    expected = torch.cat([dense_causal(s) for s in seqs])
    torch.testing.assert_close(out, expected)


def test_decode_chunk_and_prompt_side_by_side():
    # The picture in the module docstring of paged.py: A a whole prompt, B one decode token
    # after 7 cached ones, C a chunk of 2 after 4 cached ones, tables deliberately out of order.
    gen = torch.Generator().manual_seed(0)
    block_size, num_kv_heads, head_dim = 4, 2, 8

    def seq(context_len, num_queries, table):
        return PagedSeq(
            keys=torch.randn(context_len, num_kv_heads, head_dim, generator=gen),
            values=torch.randn(context_len, num_kv_heads, head_dim, generator=gen),
            queries=torch.randn(num_queries, 2 * num_kv_heads, head_dim, generator=gen),
            block_table=table,
        )

    seqs = [seq(4, 4, [3]), seq(8, 1, [5, 1]), seq(6, 2, [2, 0])]
    shape = (6, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
    write_prefix(seqs, k_cache, v_cache, random.Random(0))
    q, k, v, meta = this_step(seqs, block_size)
    assert meta.query_start_loc.tolist() == [0, 4, 5, 7]
    assert meta.slot_mapping.tolist() == [12, 13, 14, 15, 7, 0, 1]
    write_kv_reference(k_cache, v_cache, k, v, meta.slot_mapping)
    out = paged_attention_reference(q, k_cache, v_cache, meta)
    torch.testing.assert_close(out, torch.cat([dense_causal(s) for s in seqs]))
    # Each sequence alone gives the same rows: sequences of one step never see each other.
    for i, s in enumerate(seqs):
        q1, _, _, meta1 = this_step([s], block_size)
        rows = slice(meta.query_start_loc[i].item(), meta.query_start_loc[i + 1].item())
        torch.testing.assert_close(
            paged_attention_reference(q1, k_cache, v_cache, meta1), out[rows]
        )


@pytest.mark.parametrize("seed", range(4))
def test_chunked_prefill_equals_whole_prompt(seed):
    # Writing a prompt chunk by chunk (each chunk attending to the chunks cached before it)
    # gives the same outputs as one whole-prompt step.
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    block_size, context_len, num_kv_heads, head_dim = (
        rng.choice(BLOCK_SIZES),
        rng.randint(2, 40),
        2,
        8,
    )
    num_blocks = -(-context_len // block_size) + 2
    table = rng.sample(range(num_blocks), num_blocks - 2)  # shuffled, two blocks left unused
    keys, values = torch.randn(2, context_len, num_kv_heads, head_dim, generator=gen)
    queries = torch.randn(context_len, 2 * num_kv_heads, head_dim, generator=gen)
    whole = dense_causal(PagedSeq(keys, values, queries, table))
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
    cuts = sorted(rng.sample(range(1, context_len), min(3, context_len - 1)))
    pieces = []
    for start, end in zip([0] + cuts, cuts + [context_len]):
        part = PagedSeq(keys[:end], values[:end], queries[start:end], table)
        q, k, v, meta = this_step([part], block_size)
        write_kv_reference(k_cache, v_cache, k, v, meta.slot_mapping)
        pieces.append(paged_attention_reference(q, k_cache, v_cache, meta))
    torch.testing.assert_close(torch.cat(pieces), whole)


def test_the_gather_plan_is_built_once_per_step_and_groups_decodes_and_chunks(monkeypatch):
    rng = random.Random(7)
    seqs, k_cache, v_cache = random_case(rng, ratio=2, block_size=4)
    while {s.num_queries == 1 for s in seqs} != {True, False}:  # a step with decodes and chunks
        seqs, k_cache, v_cache = random_case(rng, ratio=2, block_size=4)
    write_prefix(seqs, k_cache, v_cache, rng)
    q, k, v, meta = this_step(seqs, 4)
    write_kv_reference(k_cache, v_cache, k, v, meta.slot_mapping)
    first = paged_attention_reference(q, k_cache, v_cache, meta)  # a one-off call plans itself
    plan = TORCH_BACKEND.plan(meta, 4, k_cache.shape[2])
    assert [g.query_rows.shape[1] == 1 for g in plan.groups] == [True, False] and not plan.covers_all_rows
    assert sorted(torch.cat([g.out_rows for g in plan.groups]).tolist()) == list(range(q.shape[0]))
    # Every layer of the step reuses the plan: no planning, the same result.
    monkeypatch.setattr(paged, "plan_reference_attention", lambda *args: pytest.fail("planned again"))
    for _ in range(3):
        out = TORCH_BACKEND.attend(q, k_cache, v_cache, plan)
        torch.testing.assert_close(out, first, rtol=0, atol=0)
    # A plan made for another cache geometry is refused, not misread.
    with pytest.raises(ValueError, match="plan was made for block_size=4"):
        paged_attention_reference(q, k_cache.view(-1, 2, *k_cache.shape[2:]), v_cache, meta, plan)


def test_the_attention_context_plans_once_per_step_before_the_first_layer():
    # A forward pass over several layers: the backend plans once, when the context is built,
    # and every layer's attend gets that same plan.
    rng = random.Random(5)
    seqs, k_cache, v_cache = random_case(rng, ratio=2, block_size=3)
    write_prefix(seqs, k_cache, v_cache, rng)
    q, k, v, meta = this_step(seqs, 3)
    num_layers = 3
    cache = SimpleNamespace(k=[k_cache.clone() for _ in range(num_layers)], v=[v_cache.clone() for _ in range(num_layers)])
    calls = []

    class CountingBackend(TorchBackend):
        def plan(self, meta, block_size, num_kv_heads):
            calls.append(("plan", (block_size, num_kv_heads)))
            return super().plan(meta, block_size, num_kv_heads)

        def _attend(self, q, k_cache, v_cache, plan):
            calls.append(("attend", id(plan)))
            return super()._attend(q, k_cache, v_cache, plan)

    attn = PagedAttention(cache, meta, CountingBackend())
    assert calls == [("plan", (3, k_cache.shape[2]))]  # before any layer runs
    outs = [attn.attend(layer, q, k, v) for layer in range(num_layers)]
    assert calls[1:] == [("attend", id(attn.plan))] * num_layers
    expected = torch.cat([dense_causal(s) for s in seqs])
    for out in outs:
        torch.testing.assert_close(out, expected)


def test_a_pure_decode_step_needs_no_query_gather():
    rng = random.Random(3)
    seqs, k_cache, v_cache = random_case(rng, ratio=1, block_size=3)
    seqs = [PagedSeq(s.keys, s.values, s.queries[-1:], s.block_table) for s in seqs]
    write_prefix(seqs, k_cache, v_cache, rng)
    q, k, v, meta = this_step(seqs, 3)
    write_kv_reference(k_cache, v_cache, k, v, meta.slot_mapping)
    out = paged_attention_reference(q, k_cache, v_cache, meta)
    assert TORCH_BACKEND.plan(meta, 3, k_cache.shape[2]).covers_all_rows
    torch.testing.assert_close(out, torch.cat([dense_causal(s) for s in seqs]))


# ---------------------------------------------------------------------- the CPU backend == the reference
# attention/cpu.py: SDPA for prompts and chunks, the compiled paged decode (or SDPA over a copy
# without it) for decodes.  Each must give the reference's output, whatever the step mixes.
def cpu_backends(cpu_attention_kernel):
    return {"kernel": CpuBackend(cpu_attention_kernel), "sdpa": CpuBackend(None)}


@pytest.fixture(scope="module")
def cpu_attention_kernel():
    """The compiled paged decode (attention/cpu_paged_decode.cpp); a skip where it cannot be
    built (a failure under MINILM_REQUIRE_MICROKERNEL=1, as CI sets it)."""
    module = attention_cpu_compiled.load()
    if module is None:
        reason = f"the CPU paged decode cannot be built here: {attention_cpu_compiled.unavailable_reason()}"
        if os.environ.get("MINILM_REQUIRE_MICROKERNEL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return module


def check_backend_against_reference(backend, seqs, k_cache, v_cache, block_size, rng, tolerance):
    write_prefix(seqs, k_cache, v_cache, rng)
    q, k, v, meta = this_step(seqs, block_size)
    write_kv_reference(k_cache, v_cache, k, v, meta.slot_mapping)
    want = paged_attention_reference(q, k_cache, v_cache, meta)
    plan = backend.plan(meta, block_size, k_cache.shape[2])
    got = backend.attend(q, k_cache, v_cache, plan)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), **tolerance)
    return plan


@pytest.mark.parametrize("path", ["kernel", "sdpa"])
@pytest.mark.parametrize("ratio", GQA_RATIOS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("seed", range(4))
def test_cpu_backend_matches_the_reference(seed, block_size, ratio, path, cpu_attention_kernel):
    rng = random.Random(seed * 1000 + block_size * 10 + ratio)
    seqs, k_cache, v_cache = random_case(rng, ratio, block_size)
    backend = cpu_backends(cpu_attention_kernel)[path]
    check_backend_against_reference(backend, seqs, k_cache, v_cache, block_size, rng, {})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [40, 64, 128])  # the kernel's vector loops and their tails
@pytest.mark.parametrize("kind", ["decodes", "mixed"])
def test_cpu_backend_at_model_head_sizes(kind, head_dim, dtype, cpu_attention_kernel):
    rng = random.Random(head_dim)
    gen = torch.Generator().manual_seed(head_dim)
    block_size, num_kv_heads, num_heads = 16, 2, 4
    shapes = [(rng.randint(1, 100), 1) for _ in range(4)]
    if kind == "mixed":
        shapes += [(60, 60), (90, 7)]  # a whole prompt, a chunk after a prefix (a verify step)
    blocks = [-(-length // block_size) for length, _ in shapes]
    ids = list(range(sum(blocks) + 2))
    rng.shuffle(ids)
    seqs = []
    for (length, num_queries), n in zip(shapes, blocks):
        table, ids = ids[:n], ids[n:]
        keys, values = torch.randn(2, length, num_kv_heads, head_dim, generator=gen).to(dtype)
        queries = torch.randn(num_queries, num_heads, head_dim, generator=gen).to(dtype)
        seqs.append(PagedSeq(keys, values, queries, table))
    shape = (sum(blocks) + 2, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.full(shape, float("nan"), dtype=dtype), torch.full(shape, float("nan"), dtype=dtype)
    # bf16: the reference rounds the scores and the probabilities to bf16, the backend keeps them
    # in float32; the two differ by a few bf16 steps of outputs of size ~1.
    tolerance = {} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 2e-2}
    for path, backend in cpu_backends(cpu_attention_kernel).items():
        plan = check_backend_against_reference(backend, seqs, k_cache.clone(), v_cache.clone(), block_size,
                                               random.Random(0), tolerance)
        assert plan.covers_all_rows == (kind == "decodes") and len(plan.chunks) == (2 if kind == "mixed" else 0), path


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_decode_kernel_splits_long_contexts_and_merges_them_exactly(dtype, threads, cpu_attention_kernel):
    # Contexts long enough to be cut into several parts of up to 512 tokens (parts of whole
    # blocks, ending mid-block at the context's end), beside a 1-token and a 1-block one:
    # the merged softmax must be the reference's.
    rng, gen = random.Random(7), torch.Generator().manual_seed(7)
    block_size, num_kv_heads, num_heads, head_dim = 16, 2, 6, 64
    lengths = [1, 16, 700, 1500]
    blocks = [-(-n // block_size) for n in lengths]
    ids = list(range(sum(blocks)))
    rng.shuffle(ids)
    seqs = []
    for length, n in zip(lengths, blocks):
        table, ids = ids[:n], ids[n:]
        keys, values = (4 * torch.randn(2, length, num_kv_heads, head_dim, generator=gen)).to(dtype)
        queries = torch.randn(1, num_heads, head_dim, generator=gen).to(dtype)
        seqs.append(PagedSeq(keys, values, queries, table))
    shape = (sum(blocks), block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.full(shape, float("nan"), dtype=dtype), torch.full(shape, float("nan"), dtype=dtype)
    write_prefix(seqs, k_cache, v_cache, random.Random(0))
    q, k, v, meta = this_step(seqs, block_size)
    write_kv_reference(k_cache, v_cache, k, v, meta.slot_mapping)
    # The reference in float32 on the same values: in bf16 it rounds every score and probability
    # (off by up to 0.13 over 1,500 sharp ones), where the kernel keeps them in float32.
    want = paged_attention_reference(q.float(), k_cache.float(), v_cache.float(), meta)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = CpuBackend(cpu_attention_kernel).attend(q, k_cache, v_cache, meta)
    finally:
        torch.set_num_threads(before)
    # bf16: one rounding of outputs of size ~1 (2^-8 relative), and a little more
    tolerance = {} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 8e-3}
    torch.testing.assert_close(got.float(), want, **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_kv_write_equals_the_reference(dtype, cpu_attention_kernel):
    gen = torch.Generator().manual_seed(3)
    shape = (6, 4, 3, 40)  # 24 slots of 3 heads of 40
    want, got = (torch.full(shape, float("nan"), dtype=dtype) for _ in range(2))
    want_v, got_v = (torch.full(shape, float("nan"), dtype=dtype) for _ in range(2))
    # k and v as the fused path hands them over: views of one wider row per token
    qkv = torch.randn(5, 3 + 3 + 3, 40, generator=gen).to(dtype)
    k, v = qkv[:, 3:6], qkv[:, 6:]
    slots = torch.tensor([23, 0, 9, 4, 17])
    write_kv_reference(want, want_v, k, v, slots)
    CpuBackend(cpu_attention_kernel).write_kv(got, got_v, k, v, slots)
    assert torch.equal(got.nan_to_num(-1), want.nan_to_num(-1)) and torch.equal(got_v.nan_to_num(-1), want_v.nan_to_num(-1))
    with pytest.raises(RuntimeError, match="slot outside the cache"):
        cpu_attention_kernel.write_kv(got, got_v, k, v, torch.tensor([0, 1, 2, 3, 24]))


def test_auto_is_the_cpu_backend_on_a_cpu(cpu_attention_kernel):
    from minilm_engine.model.attention.backends import get_attention_backend

    backend = get_attention_backend("auto", "cpu", torch.float32)
    assert backend.name == "cpu" and backend.micro is cpu_attention_kernel
    assert get_attention_backend("cpu", "cpu").name == "cpu"
    assert get_attention_backend("torch", "cpu") is TORCH_BACKEND


def test_the_decode_kernel_refuses_what_it_cannot_read(cpu_attention_kernel):
    q = torch.randn(1, 2, 8)
    cache = torch.zeros(3, 4, 1, 8)
    tables, lens = torch.tensor([[0, 1]]), torch.tensor([5])
    cpu_attention_kernel.paged_decode(q, cache, cache, tables, lens)  # fine
    with pytest.raises(RuntimeError, match="block id outside the cache"):
        cpu_attention_kernel.paged_decode(q, cache, cache, torch.tensor([[0, 7]]), lens)
    with pytest.raises(RuntimeError, match="context_lens must be in"):
        cpu_attention_kernel.paged_decode(q, cache, cache, tables, torch.tensor([9]))
    with pytest.raises(RuntimeError, match="one dtype"):
        cpu_attention_kernel.paged_decode(q.bfloat16(), cache, cache, tables, lens)


def test_the_engine_on_the_cpu_backend_gives_the_reference_tokens_and_logits(checkpoint, prompts, cpu_attention_kernel):
    # Whole generations (prompts, then decodes over the paged cache, some steps mixing both):
    # greedy tokens equal to the torch reference's, and the logits of every step close.
    from minilm_engine import LLM, SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=1)
    args = dict(record_trace=False, kv_cache_memory=8 << 20, max_num_batched_tokens=64)
    reference = LLM(checkpoint.path, attention_backend="torch", **args)
    fast = LLM(checkpoint.path, attention_backend="auto", **args)
    assert fast.engine.attention_backend.name == "cpu" and reference.engine.attention_backend.name == "torch"
    want = reference.generate(prompts, greedy, use_tqdm=False)
    got = fast.generate(prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    for g, w in zip(got, want):
        ids = w.outputs[0].token_ids
        got_lp = [step[t].logprob for step, t in zip(g.outputs[0].logprobs, ids)]
        want_lp = [step[t].logprob for step, t in zip(w.outputs[0].logprobs, ids)]
        torch.testing.assert_close(torch.tensor(got_lp), torch.tensor(want_lp), rtol=1e-4, atol=1e-4)
