"""Tests for minilm_engine.course.experiments.kernel_stats: byte counts, the random batch, the timer.

The byte counts are checked against the tensors themselves (what a kernel that reads each
cached key and value once would load); the random batch against the torch reference (its
NaN guards must be invisible to a correct gather); the Triton parts run in the interpreter on
the CPU (conftest.py sets TRITON_INTERPRET=1 first), natively on a GPU.
"""

from __future__ import annotations

import itertools
import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # conftest.py did it already, earlier

from minilm_engine.model.attention.paged import paged_attention_reference  # noqa: E402
from minilm_engine.course.experiments.kernel_stats import (  # noqa: E402
    decode_arithmetic_intensity,
    decode_kv_bytes,
    decode_traffic,
    key_locations,
    measure_decode_bandwidth,
    online_softmax,
    random_paged_batch,
    time_decode_kernel,
    with_contiguous_blocks,
)
from minilm_engine.course.known_configs import known_config  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_decode_kv_bytes_counts_each_cached_element_once():
    # Qwen3-0.6B, one layer: 8 K/V heads of 128 in bf16 -> 4 KiB of K+V per token.
    assert decode_kv_bytes(1, 1, 8, 128, torch.bfloat16) == 4096
    assert decode_kv_bytes(64, 1000, 8, 128, torch.bfloat16) == 64 * 1000 * 4096
    assert decode_kv_bytes(1, 10, 1, 64, torch.float32) == 2 * 10 * 64 * 4
    assert decode_kv_bytes(2, 3, 1, 64, torch.float8_e4m3fn) == 2 * 2 * 3 * 64


def test_decode_kv_bytes_is_the_models_kv_cache_per_token_per_layer():
    config = known_config("Qwen3-0.6B")
    per_layer = decode_kv_bytes(1, 1, config.num_key_value_heads, config.head_dim, torch.bfloat16)
    assert per_layer * config.num_hidden_layers == config.kv_bytes_per_token(2)


def test_decode_traffic_and_intensity():
    t = decode_traffic(4, 100, 16, 8, 128, torch.bfloat16)
    assert t.kv_bytes == decode_kv_bytes(4, 100, 8, 128, torch.bfloat16)
    assert t.q_bytes == t.out_bytes == 4 * 16 * 128 * 2
    assert t.read_bytes == t.kv_bytes + t.q_bytes
    # G = 2 query heads per K/V head in bf16: 4*G*D FLOPs over 2*D*2 bytes = 2 FLOP/byte.
    assert decode_arithmetic_intensity(16, 8, torch.bfloat16) == 2.0
    assert decode_arithmetic_intensity(5, 1, torch.float32) == 2.5


def test_key_locations_follow_the_block_table():
    locations = key_locations([7, 2, 9], block_size=4, context_len=10)
    assert [b for _, b, _ in locations] == [7] * 4 + [2] * 4 + [9] * 2
    assert [r for _, _, r in locations] == [0, 1, 2, 3] * 2 + [0, 1]
    assert [p for p, _, _ in locations] == list(range(10))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_random_paged_batch_is_a_valid_decode_step(dtype):
    lens = [1, 4, 5, 33]
    batch = random_paged_batch(lens, num_heads=4, num_kv_heads=2, head_dim=8, block_size=4, dtype=dtype, seed=3)
    meta = batch.meta
    assert batch.q.shape == (4, 4, 8) and batch.q.dtype == dtype
    assert meta.context_lens.tolist() == lens and meta.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    # Blocks are shuffled and distinct; every slot nobody owns holds NaN.
    used = [b for i, n in enumerate(lens) for b in meta.block_tables[i, : math.ceil(n / 4)].tolist()]
    assert len(set(used)) == len(used) == sum(math.ceil(n / 4) for n in lens)
    assert int(batch.k_cache.isnan().any(-1).any(-1).sum()) == batch.k_cache.shape[0] * 4 - sum(lens)
    # The slot of each query is that of its sequence's last token.
    for i, n in enumerate(lens):
        block, row = key_locations(meta.block_tables[i].tolist(), 4, n)[-1][1:]
        assert meta.slot_mapping[i] == block * 4 + row
    out = paged_attention_reference(batch.q, batch.k_cache, batch.v_cache, meta)
    assert not out.isnan().any()
    assert batch.traffic().kv_bytes == decode_kv_bytes(1, sum(lens), 2, 8, dtype)


def test_contiguous_blocks_give_the_same_attention():
    batch = random_paged_batch([3, 9, 20], num_heads=2, num_kv_heads=1, head_dim=8, block_size=4, seed=1)
    flat = with_contiguous_blocks(batch)
    assert flat.meta.block_tables[0, 0] == 0 and flat.meta.block_tables[1, :3].tolist() == [1, 2, 3]
    torch.testing.assert_close(
        paged_attention_reference(flat.q, flat.k_cache, flat.v_cache, flat.meta),
        paged_attention_reference(batch.q, batch.k_cache, batch.v_cache, batch.meta),
        rtol=0, atol=0,
    )


# ------------------------------------------------------------ the kernel (Triton)
triton = pytest.importorskip("triton")
from minilm_engine.model.attention import triton_paged_prefill  # noqa: E402

needs_kernels = pytest.mark.skipif(
    DEVICE.type == "cpu" and not triton_paged_prefill.is_interpreted(),
    reason="no GPU, and triton was imported before TRITON_INTERPRET=1 was set",
)


@needs_kernels
def test_time_and_bandwidth_of_the_decode_kernel():
    batch = random_paged_batch([5, 17], num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, device=DEVICE)
    assert time_decode_kernel(batch, num_repeats=2) > 0
    (point,) = measure_decode_bandwidth(
        [9], num_seqs=2, num_heads=2, num_kv_heads=1, head_dim=16, dtype=torch.float32, device=DEVICE,
        block_size=4, num_repeats=2,
    )
    assert point.read_bytes == decode_traffic(2, 9, 2, 1, 16, torch.float32).read_bytes
    assert point.seconds > 0 and point.bytes_per_s == point.read_bytes / point.seconds


@needs_kernels
def test_decode_kernel_on_the_random_batch_matches_the_reference():
    from minilm_engine.model.attention.triton_paged_decode import paged_decode_attention

    batch = random_paged_batch([1, 16, 17, 40], num_heads=6, num_kv_heads=2, head_dim=12, block_size=4,
                               device=DEVICE)
    out = paged_decode_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta)
    torch.testing.assert_close(out, paged_attention_reference(batch.q, batch.k_cache, batch.v_cache, batch.meta))


@pytest.mark.parametrize("block_n", [1, 4, 16, 100])
def test_online_softmax_equals_softmax_whatever_the_tile(block_n):
    gen = torch.Generator().manual_seed(0)
    scores = 5 * torch.randn(37, generator=gen)
    values = torch.randn(37, 8, generator=gen)
    out, steps = online_softmax(scores, values, block_n)
    torch.testing.assert_close(out, torch.softmax(scores, 0) @ values)
    assert len(steps) == math.ceil(37 / block_n) and steps[0].alpha == 0.0
    assert steps[-1].m == float(scores.max())
    # The running maximum never falls, and alpha < 1 exactly when a tile raised it.
    for before, after in itertools.pairwise(steps):
        assert after.m >= before.m
        assert (after.alpha < 1) == (after.tile_max > before.m)
