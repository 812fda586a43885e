"""Tests for minilm_engine.worker.cuda_graphs: padded, graph-replayed decode equals eager decode.

On a CPU there are no graphs, but `DecodeGraphRunner.run` executes the same padded,
static-buffer forward that a graph records, so these tests check everything a graph adds
except the recording itself: bucket choice, padding rows, buffer reuse from one step to the
next, and that padding writes nowhere but the scratch block.  With CUDA, the tests marked
`gpu` capture real graphs and compare replays with eager steps and with the whole engine run
with `enforce_eager=True`.
"""

from __future__ import annotations

import random

import pytest
import torch

from minilm_engine import LLM, SamplingParams
from minilm_engine.core.config import EngineConfig
from minilm_engine.worker.cuda_graphs import DecodeGraphRunner, capture_sizes
from minilm_engine.model.attention.paged import PagedAttentionMetadata
from minilm_engine.model.attention.context import PagedAttention
from minilm_engine.model.attention.kv_cache import PagedKVCache
from minilm_engine.model.loader import load_model

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs need a CUDA GPU")


@pytest.mark.parametrize(
    "max_batch_size, expected",
    [
        (1, [1]),
        (3, [1, 2, 3]),
        (8, [1, 2, 4, 8]),
        (16, [1, 2, 4, 8, 16]),
        (20, [1, 2, 4, 8, 16, 20]),
        (33, [1, 2, 4, 8, 16, 24, 32, 33]),
    ],
)
def test_capture_sizes(max_batch_size, expected):
    assert capture_sizes(max_batch_size) == expected


def test_every_batch_size_has_a_bucket_with_little_padding():
    sizes = capture_sizes(256)
    for batch in range(1, 257):
        bucket = next(b for b in sizes if b >= batch)
        assert bucket - batch < 8  # never more than 7 padding rows
        assert bucket == 1 or bucket < 2 * batch  # and fewer padding rows than real ones


def test_capture_sizes_rejects_zero():
    with pytest.raises(ValueError, match="max_batch_size"):
        capture_sizes(0)


# ----------------------------------------------------------------- one decode step, random


def random_decode_step(rng: random.Random, num_seqs: int, cache: PagedKVCache, vocab_size: int):
    """B sequences with random context lengths on shuffled blocks, one new token each."""
    block_size = cache.block_size
    lengths = [rng.randint(1, 30) for _ in range(num_seqs)]
    ids = list(range(cache.num_blocks))
    rng.shuffle(ids)
    tables = []
    for length in lengths:
        n = -(-length // block_size)
        tables.append(ids[:n])
        ids = ids[n:]
    width = max(len(t) for t in tables)
    last_slots = [t[(n - 1) // block_size] * block_size + (n - 1) % block_size for t, n in zip(tables, lengths)]
    meta = PagedAttentionMetadata(
        slot_mapping=torch.tensor(last_slots),
        query_start_loc=torch.arange(num_seqs + 1),
        context_lens=torch.tensor(lengths),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
    )
    input_ids = torch.tensor([rng.randrange(vocab_size) for _ in range(num_seqs)])
    positions = torch.tensor(lengths) - 1
    return input_ids, positions, meta


def random_cache(model, num_blocks: int, block_size: int, seed: int) -> PagedKVCache:
    cache = PagedKVCache(model.config, num_blocks, block_size, model.dtype, model.device)
    gen = torch.Generator().manual_seed(seed)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=gen))
    return cache


def clone_cache(cache: PagedKVCache) -> PagedKVCache:
    copy = object.__new__(PagedKVCache)
    copy.__dict__.update(cache.__dict__)
    copy.k, copy.v = [t.clone() for t in cache.k], [t.clone() for t in cache.v]
    return copy


def test_padded_decode_steps_equal_eager_steps(checkpoints):
    """Steps of 5, 1, 9, 3 and 16 sequences through one runner (buckets 8, 1, 16, 4, 16): each
    equals the eager forward, and only the step's own slots and the scratch block change."""
    model = load_model(checkpoints["qwen3"].path)
    block_size, num_blocks = 4, 140
    eager_cache = random_cache(model, num_blocks, block_size, seed=0)
    graph_cache = clone_cache(eager_cache)
    runner = DecodeGraphRunner(model, graph_cache, None, max_batch_size=16, max_blocks_per_seq=10)
    rng = random.Random(0)
    with torch.inference_mode():
        for num_seqs in (5, 1, 9, 3, 16):
            input_ids, positions, meta = random_decode_step(rng, num_seqs, eager_cache, model.config.vocab_size)
            assert runner.can_run(num_seqs, meta)
            expected = model(input_ids, positions, PagedAttention(eager_cache, meta))
            got = runner.run(input_ids, positions, meta)
            torch.testing.assert_close(got, expected)
            for layer in range(len(eager_cache.k)):
                # the pool's blocks, scratch left out: same keys and values written
                torch.testing.assert_close(graph_cache.k[layer][:num_blocks], eager_cache.k[layer][:num_blocks])
                torch.testing.assert_close(graph_cache.v[layer][:num_blocks], eager_cache.v[layer][:num_blocks])
    assert runner.num_runs == 5 and runner.num_replays == 0  # no graphs on a CPU
    # Between steps every row is padding again: scratch slot, one token of context.
    assert (runner.slot_mapping == runner.pad_slot).all() and (runner.context_lens == 1).all()


def test_runner_refuses_what_it_cannot_run(checkpoints):
    model = load_model(checkpoints["qwen3"].path)
    cache = PagedKVCache(model.config, 64, 4, model.dtype, model.device)
    runner = DecodeGraphRunner(model, cache, None, max_batch_size=4, max_blocks_per_seq=3)
    rng = random.Random(1)
    _, _, meta = random_decode_step(rng, 4, cache, model.config.vocab_size)
    assert not runner.can_run(5, meta)  # more tokens than sequences: a prefill step
    _, _, big = random_decode_step(rng, 5, cache, model.config.vocab_size)
    assert not runner.can_run(5, big)  # more sequences than the largest bucket
    wide = PagedAttentionMetadata(meta.slot_mapping, meta.query_start_loc, meta.context_lens,
                                  torch.zeros(4, 4, dtype=torch.long))
    assert not runner.can_run(4, wide)  # a block table wider than the static one
    with pytest.raises(RuntimeError, match="need the Triton attention backend"):
        runner.capture()  # the torch reference (backend None) plans each step on the host


def test_capture_needs_a_cuda_device(checkpoints):
    if HAS_CUDA:
        pytest.skip("checks the error on a machine without CUDA")
    triton_paged_prefill = pytest.importorskip("minilm_engine.model.attention.triton_paged_prefill")
    if not triton_paged_prefill.is_interpreted():
        pytest.skip("the Triton backend runs on the CPU only under TRITON_INTERPRET=1")
    from minilm_engine.model.attention.backends import get_attention_backend

    model = load_model(checkpoints["qwen3"].path)
    cache = PagedKVCache(model.config, 8, 4, model.dtype, model.device)
    runner = DecodeGraphRunner(model, cache, get_attention_backend("triton", "cpu"), 2, 2)
    with pytest.raises(RuntimeError, match="need a CUDA device"):
        runner.capture()


def test_a_failed_step_leaves_the_buffers_as_padding(checkpoints):
    model = load_model(checkpoints["qwen3"].path)
    cache = PagedKVCache(model.config, 64, 4, model.dtype, model.device)
    runner = DecodeGraphRunner(model, cache, None, max_batch_size=8, max_blocks_per_seq=8)
    input_ids, positions, meta = random_decode_step(random.Random(2), 5, cache, model.config.vocab_size)
    input_ids[2] = model.config.vocab_size + 7  # no such token: the embedding lookup fails
    with torch.inference_mode(), pytest.raises(IndexError):
        runner.run(input_ids, positions, meta)
    assert (runner.slot_mapping == runner.pad_slot).all() and (runner.context_lens == 1).all()
    assert (runner.block_tables[:, 0] == cache.scratch_block).all()


# ----------------------------------------------------------------- the whole engine


def generate_tokens(llm: LLM, prompts, max_tokens: list[int]) -> list[list[int]]:
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    return [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_engine_with_padded_decode_equals_engine_without(checkpoints, prompts, backend):
    # Different output lengths make the batch shrink as requests finish (5 -> 4 -> ... -> 1),
    # so several buckets and their padding are used.
    if backend == "triton":
        triton_paged_prefill = pytest.importorskip("minilm_engine.model.attention.triton_paged_prefill")
        if not triton_paged_prefill.is_interpreted():
            pytest.skip("the Triton kernels run on the CPU only under TRITON_INTERPRET=1")
    max_tokens = [7, 3, 5, 1, 6]
    kwargs = dict(device="cpu", dtype="float32", max_model_len=64, block_size=4, num_kv_blocks=80,
                  max_num_seqs=8, attention_backend=backend)
    path = checkpoints["qwen3"].path
    plain = generate_tokens(LLM(path, **kwargs), prompts, max_tokens)
    llm = LLM(path, **kwargs)
    engine = llm.engine
    assert engine.decode_graphs is None  # a CPU captures nothing by itself
    graphs = DecodeGraphRunner(engine.model, engine.cache, engine.attention_backend, max_batch_size=8,
                               max_blocks_per_seq=16)
    engine.runner.decode_graphs = graphs
    assert generate_tokens(llm, prompts, max_tokens) == plain
    assert graphs.num_runs >= 5  # every decode step of the run went through the padded path
    assert engine.block_pool.num_used_blocks == 0


def test_enforce_eager_is_validated():
    with pytest.raises(TypeError, match="enforce_eager"):
        EngineConfig(enforce_eager="yes")


# ----------------------------------------------------------------- real graphs (CUDA)


@pytest.mark.gpu
@needs_cuda
def test_graph_replays_equal_eager_steps(checkpoints):
    model = load_model(checkpoints["qwen3"].path, device="cuda")
    block_size, num_blocks = 4, 140
    eager_cache = random_cache(model, num_blocks, block_size, seed=0)
    graph_cache = clone_cache(eager_cache)
    from minilm_engine.model.attention.backends import get_attention_backend

    backend = get_attention_backend("triton", "cuda", model.dtype)
    runner = DecodeGraphRunner(model, graph_cache, backend, max_batch_size=16, max_blocks_per_seq=10)
    runner.capture()
    assert sorted(runner.graphs) == [1, 2, 4, 8, 16]
    rng = random.Random(0)
    with torch.inference_mode():
        for num_seqs in (5, 1, 9, 3, 16):
            input_ids, positions, meta = random_decode_step(rng, num_seqs, eager_cache, model.config.vocab_size)
            input_ids, positions = input_ids.cuda(), positions.cuda()
            meta = PagedAttentionMetadata(*(t.cuda() for t in (meta.slot_mapping, meta.query_start_loc,
                                                               meta.context_lens, meta.block_tables)))
            expected = model(input_ids, positions, PagedAttention(eager_cache, meta, backend))
            # cuBLAS may pick another GEMM for the padded height: allow fp32 rounding noise.
            close = dict(rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(runner.run(input_ids, positions, meta), expected, **close)
            for layer in range(len(eager_cache.k)):
                torch.testing.assert_close(graph_cache.k[layer][:num_blocks], eager_cache.k[layer][:num_blocks], **close)
                torch.testing.assert_close(graph_cache.v[layer][:num_blocks], eager_cache.v[layer][:num_blocks], **close)
    assert runner.num_replays == 5


@pytest.mark.gpu
@needs_cuda
def test_engine_with_graphs_equals_enforce_eager(checkpoints, prompts):
    # fp32: a graph pads the batch to its bucket, and in half precision a GEMM of another
    # height may round differently; in fp32 greedy tokens must agree exactly.
    max_tokens = [12, 3, 9, 1, 7]
    kwargs = dict(device="cuda", dtype="float32", max_model_len=64, block_size=4, num_kv_blocks=80, max_num_seqs=8)
    tokens = {}
    for eager in (True, False):
        llm = LLM(checkpoints["qwen3"].path, enforce_eager=eager, **kwargs)
        graphs = llm.engine.decode_graphs
        assert (graphs is None) == eager and llm.engine.attention_backend.name == "triton"
        tokens[eager] = generate_tokens(llm, prompts, max_tokens)
        if not eager:
            assert graphs.num_replays > 0 and graphs.num_replays == graphs.num_runs
    assert tokens[False] == tokens[True]
