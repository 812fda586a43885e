"""Tests for minilm_engine.course.experiments.launches: op counts and bucket padding."""

from __future__ import annotations

import pytest
import torch

from minilm_engine.worker.cuda_graphs import DecodeGraphRunner
from minilm_engine.course.experiments.launches import count_ops, graph_speedup, padding_per_bucket
from minilm_engine.model.attention.kv_cache import PagedKVCache
from minilm_engine.model.loader import load_model


def test_count_ops_counts_operations_not_views():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    assert count_ops(lambda: (a @ b).t().relu() + 1) == {"mm": 1, "relu": 1, "add": 1}  # .t() is a view
    # Flattening a transposed tensor must copy it: that is an operation (a kernel on a GPU).
    assert count_ops(lambda: (a @ b).t().reshape(-1)) == {"mm": 1, "clone": 1}


def test_a_decode_step_launches_a_fixed_number_of_ops_per_layer(checkpoints):
    model = load_model(checkpoints["qwen3"].path)
    cache = PagedKVCache(model.config, 8, 4, model.dtype, model.device)
    runner = DecodeGraphRunner(model, cache, None, max_batch_size=4, max_blocks_per_seq=2)
    with torch.inference_mode():
        one = sum(count_ops(lambda: runner.forward_bucket(1)).values())
        four = sum(count_ops(lambda: runner.forward_bucket(4)).values())
    assert one == four  # the number of launches does not depend on the batch: why batching is cheap
    assert one > 20 * model.config.num_hidden_layers  # dozens of operations per layer


def test_padding_per_bucket():
    padding = padding_per_bucket(16)
    assert padding[1] == padding[2] == padding[4] == padding[8] == padding[16] == 0
    assert padding[3] == 1 / 4 and padding[5] == 3 / 8 and padding[9] == 7 / 16
    assert set(padding) == set(range(1, 17))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error")
def test_graph_speedup_needs_a_gpu(checkpoints):
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        graph_speedup(checkpoints["qwen3"].path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_speedup_on_a_gpu(checkpoints):
    result = graph_speedup(checkpoints["qwen3"].path, num_tokens=32, dtype="float32", max_model_len=128)
    assert result.num_replays >= 31 and result.graphs_tokens_per_s > 0 and result.eager_tokens_per_s > 0
