"""Tests for the Triton attention backend: every kernel equals the torch reference.

Without CUDA the kernels run in the Triton interpreter on the CPU; with CUDA they run natively
on the GPU.  The interpreter is switched on by TRITON_INTERPRET=1, which must be set before
anything imports triton (`@triton.jit`, triton's own `tl.sum`, `tl.zeros` included, reads it
when a function is defined), and transformers imports triton: so conftest.py sets it, first
thing.  Without Triton the whole module is skipped.

Each case is a step of the paged engine drawn the way test_paged_attention.py draws them: a
NaN-filled cache (reading a slot nobody wrote poisons the output), block ids shuffled across
the pool, the cached prefix written in an earlier step and the new tokens in this one.  The
cases aim at the edges of the kernels: contexts of 1 token, ending on and just past a block or
a key tile (16), long contexts, head_dim and GQA groups that are not powers of two (padded
with masks), GQA ratios 1, 2, 4 and 5 (noodle-chef: 5 query heads on 1 K/V head).

Shapes stay small: the interpreter runs each program instance in numpy, one after another.
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from dataclasses import dataclass

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # conftest.py did it already, earlier

pytest.importorskip("triton", reason="Triton is not installed (it comes with the 'test' extra on Linux x86-64)")

import minilm_engine.model.attention as attention_package  # noqa: E402
from minilm_engine import LLM, SamplingParams  # noqa: E402
from minilm_engine.model.attention import backends, triton_paged_prefill  # noqa: E402
from minilm_engine.model.attention import triton_paged_decode_split  # noqa: E402
from minilm_engine.model.attention.triton_paged_decode import paged_decode_attention  # noqa: E402
from minilm_engine.model.attention.triton_paged_decode_split import paged_decode_split_attention  # noqa: E402
from minilm_engine.model.attention.triton_paged_prefill import paged_prefill_attention  # noqa: E402
from minilm_engine.model.attention.triton_write_kv import write_kv  # noqa: E402
from minilm_engine.core.config import EngineConfig  # noqa: E402
from minilm_engine.model.attention.paged import paged_attention_reference, write_kv_reference  # noqa: E402
from test_paged_attention import PagedSeq, this_step, write_prefix  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cpu" and not triton_paged_prefill.is_interpreted():
    pytest.skip(
        "no GPU, and triton was imported before TRITON_INTERPRET=1 was set (see conftest.py)",
        allow_module_level=True,
    )
# Half-precision outputs are compared with the reference run in fp32 on the same (rounded)
# inputs: the kernels keep scores and sums in fp32, so they differ from it by about one
# rounding of the output, which is what these tolerances allow (two units in the last place).
TOLERANCES = {
    torch.float32: {},  # assert_close's defaults
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
}


@dataclass
class Case:
    """One engine step: per sequence (context_len, num_queries), heads, head_dim, blocks, dtype."""

    seqs: list[tuple[int, int]]
    ratio: int  # query heads per K/V head
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype = torch.float32

    def __repr__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return (
            f"seqs{self.seqs}-G{self.ratio}xKV{self.num_kv_heads}-D{self.head_dim}-bs{self.block_size}-{dtype}"
        )


def random_cases(seed: int, count: int, decode_only: bool) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        seqs = []
        for _ in range(rng.randint(1, 4)):
            context_len = rng.randint(1, 48)
            num_queries = 1 if decode_only else rng.choice([1, context_len, rng.randint(1, context_len)])
            seqs.append((context_len, num_queries))
        cases.append(
            Case(
                seqs,
                ratio=rng.choice([1, 2, 4, 5]),
                num_kv_heads=rng.choice([1, 2]),
                head_dim=rng.choice([8, 16, 32]),
                block_size=rng.choice([1, 3, 4, 16]),
                dtype=rng.choice([torch.float32, torch.float16]),
            )
        )
    return cases


def build(case: Case, seed: int = 0):
    """The step on DEVICE: (q, k, v, meta) of the new tokens, caches holding the prefix."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-context_len // case.block_size) for context_len, _ in case.seqs]
    num_blocks = sum(blocks_needed) + 2  # two blocks nobody uses
    ids = rng.sample(range(num_blocks), num_blocks)
    seqs = []
    for (context_len, num_queries), n in zip(case.seqs, blocks_needed):
        table, ids = ids[:n], ids[n:]
        keys, values = torch.randn(2, context_len, case.num_kv_heads, case.head_dim, generator=gen)
        queries = torch.randn(num_queries, case.num_kv_heads * case.ratio, case.head_dim, generator=gen)
        seqs.append(PagedSeq(keys.to(case.dtype), values.to(case.dtype), queries.to(case.dtype), table))
    shape = (num_blocks, case.block_size, case.num_kv_heads, case.head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=case.dtype)
    v_cache = torch.full(shape, float("nan"), dtype=case.dtype)
    write_prefix(seqs, k_cache, v_cache, rng)
    q, k, v, meta = this_step(seqs, case.block_size)
    meta.slot_mapping, meta.query_start_loc, meta.context_lens, meta.block_tables = (
        t.to(DEVICE) for t in (meta.slot_mapping, meta.query_start_loc, meta.context_lens, meta.block_tables)
    )
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), meta


def reference_fp32(q, k_cache, v_cache, meta) -> torch.Tensor:
    return paged_attention_reference(q.float(), k_cache.float(), v_cache.float(), meta)


def check_attention(kernel, case: Case, seed: int = 0) -> None:
    q, k, v, k_cache, v_cache, meta = build(case, seed)
    write_kv_reference(k_cache, v_cache, k, v, meta.slot_mapping)
    out = kernel(q, k_cache, v_cache, meta)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.float(), reference_fp32(q, k_cache, v_cache, meta), **TOLERANCES[case.dtype])


# ---------------------------------------------------------------------- write_kv
WRITE_CASES = [
    Case([(1, 1)], ratio=1, num_kv_heads=1, head_dim=8, block_size=1),
    Case([(9, 9), (5, 1), (20, 3)], ratio=1, num_kv_heads=2, head_dim=12, block_size=4, dtype=torch.float16),
    Case([(16, 16), (17, 2)], ratio=1, num_kv_heads=3, head_dim=8, block_size=16, dtype=torch.bfloat16),
    Case([(7, 4), (3, 3)], ratio=1, num_kv_heads=1, head_dim=64, block_size=3),
]


@pytest.mark.parametrize("case", WRITE_CASES, ids=repr)
def test_write_kv_matches_reference(case):
    _, k, v, k_cache, v_cache, meta = build(case)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    write_kv_reference(expected_k, expected_v, k, v, meta.slot_mapping)
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    # Bit for bit, and every slot nobody wrote still holds its NaN.
    torch.testing.assert_close(k_cache, expected_k, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, expected_v, rtol=0, atol=0, equal_nan=True)


# ---------------------------------------------------------------------- decode
DECODE_CASES = [
    Case([(1, 1)], ratio=1, num_kv_heads=1, head_dim=8, block_size=4),  # a one-token context
    Case([(4, 1), (8, 1), (5, 1)], ratio=2, num_kv_heads=2, head_dim=8, block_size=4),  # block edges
    Case([(16, 1), (17, 1), (32, 1), (33, 1)], ratio=4, num_kv_heads=1, head_dim=16, block_size=16,
         dtype=torch.float16),  # key-tile edges
    Case([(37, 1), (3, 1)], ratio=5, num_kv_heads=1, head_dim=64, block_size=16, dtype=torch.float16),  # chef
    Case([(7, 1), (10, 1), (1, 1)], ratio=3, num_kv_heads=2, head_dim=12, block_size=3),  # nothing a power of 2
    Case([(150, 1)], ratio=5, num_kv_heads=1, head_dim=32, block_size=16),  # long
    Case([(9, 1), (2, 1)], ratio=2, num_kv_heads=1, head_dim=8, block_size=1, dtype=torch.float16),
] + random_cases(seed=1, count=9, decode_only=True)


@pytest.mark.parametrize("case", DECODE_CASES, ids=repr)
def test_paged_decode_matches_reference(case):
    check_attention(paged_decode_attention, case)


# ---------------------------------------------------------------------- decode, split contexts
P = triton_paged_decode_split.PARTITION_SIZE
SPLIT_CASES = [
    Case([(1, 1)], ratio=1, num_kv_heads=1, head_dim=8, block_size=4),  # one partition, one token
    Case([(P, 1), (P + 1, 1)], ratio=2, num_kv_heads=2, head_dim=16, block_size=16),  # partition edges
    Case([(2 * P + 37, 1), (5, 1)], ratio=5, num_kv_heads=1, head_dim=64, block_size=16,
         dtype=torch.float16),  # three partitions beside one; the short one skips the empty ones
    Case([(P + 9, 1)], ratio=3, num_kv_heads=2, head_dim=12, block_size=3, dtype=torch.bfloat16),  # no powers of 2
    Case([(3 * P, 1), (P - 1, 1), (17, 1)], ratio=4, num_kv_heads=1, head_dim=8, block_size=1),
]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=repr)
def test_split_decode_matches_reference(case):
    check_attention(paged_decode_split_attention, case)


def test_split_decode_merges_partitions_whose_scores_differ_wildly():
    # One partition holds keys that score far above all others: the merge must rescale the
    # other partitions by exp(m_p - M) ~ 0 rather than overflow or lose the big one.
    case = Case([(2 * P + 5, 1)], ratio=1, num_kv_heads=1, head_dim=16, block_size=16)
    q, k, v, k_cache, v_cache, meta = build(case)
    k[...] = 0
    write_kv_reference(k_cache, v_cache, k, v, meta.slot_mapping)
    k_cache.view(-1, 1, 16)[meta.block_tables[0, P // 16 + 1] * 16] = 40 * q[0, 0] / q[0, 0].norm()
    out = paged_decode_split_attention(q, k_cache, v_cache, meta)
    torch.testing.assert_close(out.float(), reference_fp32(q, k_cache, v_cache, meta))


def test_when_to_split():
    should_split = triton_paged_decode_split.should_split
    assert should_split(num_seqs=1, num_kv_heads=8, max_context=1024, num_sms=132)  # batch 1: split
    assert not should_split(num_seqs=64, num_kv_heads=8, max_context=1024, num_sms=132)  # GPU full
    assert not should_split(num_seqs=1, num_kv_heads=8, max_context=P, num_sms=132)  # one partition
    assert not should_split(num_seqs=1, num_kv_heads=8, max_context=1024, num_sms=0)  # never (CPU)


# ---------------------------------------------------------------------- prefill (and mixed steps)
PREFILL_CASES = [
    Case([(1, 1)], ratio=1, num_kv_heads=1, head_dim=8, block_size=4),  # one token, no prefix
    Case([(16, 16), (17, 17)], ratio=2, num_kv_heads=2, head_dim=8, block_size=4),  # whole prompts
    Case([(20, 4), (33, 17), (5, 1)], ratio=4, num_kv_heads=1, head_dim=16, block_size=16,
         dtype=torch.float16),  # chunks after a prefix, a decode beside them
    Case([(45, 13), (2, 2)], ratio=5, num_kv_heads=1, head_dim=64, block_size=16, dtype=torch.float16),  # chef
    Case([(11, 5), (7, 7), (9, 1)], ratio=3, num_kv_heads=2, head_dim=12, block_size=3),  # no powers of 2
    Case([(120, 40)], ratio=2, num_kv_heads=1, head_dim=32, block_size=16),  # long prefix, long chunk
    Case([(10, 3), (6, 6)], ratio=1, num_kv_heads=2, head_dim=8, block_size=1, dtype=torch.float16),
] + random_cases(seed=2, count=9, decode_only=False)


@pytest.mark.parametrize("case", PREFILL_CASES, ids=repr)
def test_paged_prefill_matches_reference(case):
    check_attention(paged_prefill_attention, case)


def test_prefill_takes_the_longest_chunk_from_the_host_when_given(monkeypatch):
    case = Case([(9, 1), (40, 33), (21, 6)], ratio=2, num_kv_heads=2, head_dim=16, block_size=4)
    q, k, v, k_cache, v_cache, meta = build(case)
    write_kv_reference(k_cache, v_cache, k, v, meta.slot_mapping)
    # Outputs start as NaN: on a GPU torch.empty hands back the memory of the call before, which
    # already holds the rows a skipped tile would have written.
    empty = torch.empty

    def nan_empty(*args, **kwargs):
        out = empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", nan_empty)
    computed = paged_prefill_attention(q, k_cache, v_cache, meta)  # max_query_len None: from the device
    meta.max_query_len = 33
    assert torch.equal(paged_prefill_attention(q, k_cache, v_cache, meta), computed)
    meta.max_query_len = 16  # too small: the tiles past it would be skipped, and the test would see it
    assert not torch.equal(paged_prefill_attention(q, k_cache, v_cache, meta), computed)


@pytest.mark.parametrize("decode_only", [True, False], ids=["decode", "mixed"])
def test_backend_attend_in_bfloat16(decode_only):
    # bf16 through the backend's dispatch; under the interpreter the prefill kernel upcasts
    # bf16 to fp32 before tl.dot (the interpreter computes bf16 dots wrongly).
    seqs = [(9, 1), (21, 1)] if decode_only else [(9, 1), (21, 6)]
    case = Case(seqs, ratio=2, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.bfloat16)
    backend = backends.get_attention_backend("triton", DEVICE, torch.bfloat16)
    q, k, v, k_cache, v_cache, meta = build(case)
    backend.write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    out = backend.attend(q, k_cache, v_cache, meta)
    torch.testing.assert_close(out.float(), reference_fp32(q, k_cache, v_cache, meta), **TOLERANCES[torch.bfloat16])


@pytest.mark.parametrize(
    "seqs, num_sms, kernel",
    [([(9, 1), (21, 1)], 0, "decode"), ([(9, 1), (21, 6)], 0, "prefill"), ([(9, 1), (P + 9, 1)], 10**6, "split")],
    ids=["decode", "mixed", "split"],
)
def test_the_plan_picks_the_kernel_once_and_every_layer_uses_it(seqs, num_sms, kernel):
    # The Triton backend's plan is the step's kernel, chosen from shapes before the first layer;
    # attending with it gives what the kernel itself gives.
    case = Case(seqs, ratio=2, num_kv_heads=2, head_dim=16, block_size=16)
    backend = backends.TritonBackend(num_sms=num_sms)
    q, k, v, k_cache, v_cache, meta = build(case)
    plan = backend.plan(meta, case.block_size, case.num_kv_heads)
    assert plan.kernel == kernel and plan.meta is meta
    backend.write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    kernels = {"decode": paged_decode_attention, "split": paged_decode_split_attention,
               "prefill": paged_prefill_attention}
    torch.testing.assert_close(backend.attend(q, k_cache, v_cache, plan), kernels[kernel](q, k_cache, v_cache, meta),
                               rtol=0, atol=0)


def test_a_replaced_decode_kernel_runs_where_the_split_kernel_would():
    # On a GPU few sequences take the split kernel; a kernel put in through `pluggable` (chapter
    # A1's exercise) must run there all the same, or the check would test the package's kernel.
    from minilm_engine import pluggable
    from minilm_engine.model.attention.triton_paged_decode import paged_decode_kernel

    case = Case([(9, 1), (P + 9, 1)], ratio=2, num_kv_heads=2, head_dim=16, block_size=16)
    backend = backends.TritonBackend(num_sms=10**6)
    q, k, v, k_cache, v_cache, meta = build(case)
    assert backend.plan(meta, case.block_size, case.num_kv_heads).kernel == "split"
    with pluggable.override("attention.decode_kernel", lambda: paged_decode_kernel):
        plan = backend.plan(meta, case.block_size, case.num_kv_heads)
        assert plan.kernel == "decode"
        backend.write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        backend.attend(q, k_cache, v_cache, plan)
        assert pluggable.num_calls("attention.decode_kernel") == 1


# ---------------------------------------------------------------------- choosing a backend
def test_backend_names_resolve():
    assert backends.get_attention_backend("torch", DEVICE) is backends.TORCH_BACKEND
    assert backends.get_attention_backend("triton", DEVICE).name == "triton"
    # "auto" picks Triton on a GPU only; on a CPU it is the CPU backend (attention/cpu.py).
    assert backends.get_attention_backend("auto", "cpu").name == "cpu"
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        backends.get_attention_backend("flash", DEVICE)
    with pytest.raises(ValueError, match="attention_backend must be"):
        EngineConfig(attention_backend="cuda")


def test_triton_on_cpu_without_interpreter_warns_and_falls_back(monkeypatch):
    monkeypatch.setattr(triton_paged_prefill, "is_interpreted", lambda: False)
    with pytest.warns(UserWarning, match="TRITON_INTERPRET=1"):
        backend = backends.get_attention_backend("triton", "cpu")
    assert backend is backends.TORCH_BACKEND


def test_triton_missing_warns_and_falls_back(monkeypatch):
    # What an install without Triton sees: importing the kernels fails.
    monkeypatch.delattr(attention_package, "triton_paged_prefill")
    monkeypatch.setitem(sys.modules, "minilm_engine.model.attention.triton_paged_prefill", None)
    with pytest.warns(UserWarning, match="Triton does not import"):
        assert backends.get_attention_backend("triton", DEVICE) is backends.TORCH_BACKEND
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "auto" falls back quietly (on a CPU it never asks for Triton)
        fallback = "torch" if DEVICE.type == "cuda" else "cpu"
        assert backends.get_attention_backend("auto", DEVICE).name == fallback


# ---------------------------------------------------------------------- the whole engine
@pytest.mark.parametrize("name", ["mistral", "qwen3"])  # 4 query heads on 1 K/V head; 8 on 2
def test_engine_greedy_tokens_equal_torch_backend(checkpoints, prompts, name):
    # A small token budget makes the engine chunk the prompts and run decodes beside chunks,
    # so both kernels and the dispatch between them run.
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    tokens = {}
    for backend in ("torch", "triton"):
        llm = LLM(
            checkpoints[name].path, device=DEVICE, dtype="float32", max_model_len=64, block_size=4,
            max_num_batched_tokens=8, num_kv_blocks=80, attention_backend=backend,
        )  # a fixed pool, the same on every device
        assert llm.engine.attention_backend.name == backend
        tokens[backend] = [out.outputs[0].token_ids for out in llm.generate(prompts[:3], params, use_tqdm=False)]
    assert tokens["triton"] == tokens["torch"]
    assert all(len(t) == 6 for t in tokens["torch"])


@pytest.mark.slow  # two prompts of 148 and 244 tokens through the interpreted prefill kernel
def test_engine_with_split_decode_equals_torch_backend(checkpoints):
    # Prompts longer than one partition, and a backend told the GPU is huge, so every decode
    # step of the engine goes through the split kernel and its merge.
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(300) for _ in range(n)]} for n in (P + 20, 2 * P - 12, 9)]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    tokens = {}
    for backend in ("torch", "split"):
        llm = LLM(checkpoints["qwen3"].path, device=DEVICE, dtype="float32", max_model_len=2 * P, block_size=16,
                  num_kv_blocks=64, attention_backend="torch" if backend == "torch" else "triton")
        if backend == "split":
            llm.engine.runner.attention_backend = backends.TritonBackend(num_sms=10**6)
            assert llm.engine.decode_graphs is None or DEVICE.type == "cuda"
        tokens[backend] = [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens["split"] == tokens["torch"]
