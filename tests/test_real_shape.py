"""Tests for experiments/real_shape.py (a known model's shape with random weights, its decode step
against its weight-read floor) and kv_growth.token_time_rounds (chapter 02's alternating rounds).

Behaviour only: shapes, pairing and counts, never a timing of this machine."""

from __future__ import annotations

import pytest
import torch

from minilm_engine import LLM
from minilm_engine.experiments import real_shape
from minilm_engine.experiments.batching import weight_bytes
from minilm_engine.experiments.kv_growth import token_time_rounds
from minilm_engine.models.known_configs import KNOWN_CONFIGS

TINY = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=1, eos_token_id=2)


def test_fields_are_the_known_config_with_overrides():
    fields = real_shape.random_model_fields(real_shape.QWEN3_0_6B, num_hidden_layers=3)
    known = KNOWN_CONFIGS[real_shape.QWEN3_0_6B]
    assert fields["num_hidden_layers"] == 3
    assert fields["hidden_size"] == known["hidden_size"] and fields["head_dim"] == known["head_dim"]
    assert "architectures" not in fields and "torch_dtype" not in fields


def test_fields_reject_unknown_models_fields_and_architectures():
    with pytest.raises(KeyError, match="no known config"):
        real_shape.random_model_fields("Qwen/Qwen9-1B")
    with pytest.raises(ValueError, match="unknown config fields"):
        real_shape.random_model_fields(real_shape.QWEN3_0_6B, num_layers=2)
    llama = next(name for name, c in KNOWN_CONFIGS.items() if c["model_type"] == "llama")
    with pytest.raises(ValueError, match="Qwen3 only"):
        real_shape.random_model_fields(llama)


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    # The shape of Qwen3-0.6B cut down to a tiny one: same architecture, random bf16 weights.
    return real_shape.build_random_model(tmp_path_factory.mktemp("qwen3"), real_shape.QWEN3_0_6B, max_num_seqs=4, **TINY)


def test_built_model_has_the_asked_shape_in_bf16(tiny_qwen3):
    model = tiny_qwen3.model
    assert model.dtype == torch.bfloat16
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    out = tiny_qwen3.generate("Order for table 7:", use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) > 0


def test_matvec_bandwidth_counts_the_weight_bytes_it_streams():
    rate = real_shape.measure_matvec_bandwidth(64, torch.bfloat16, num_bytes=1 << 20, num_repeats=2)
    assert rate > 0
    assert real_shape.measure_matvec_bandwidth(64, torch.float32, num_bytes=8, num_repeats=1) > 0  # one row at least


def test_step_vs_floor_pairs_each_round(tiny_qwen3):
    rows = real_shape.step_vs_floor(tiny_qwen3.model, [2, 1], num_rounds=3, num_steps=2, context_len=8,
                                    bandwidth_bytes=1 << 20)
    assert [r.batch_size for r in rows] == [1, 2]
    for r in rows:
        assert len(r.step_s) == len(r.floor_s) == 3 and all(s > 0 for s in r.step_s)
        assert r.over_floor == tuple(s / f for s, f in zip(r.step_s, r.floor_s))
        assert len(r.matvec_floor_s) == 3 and r.over_matvec_floor == tuple(s / f for s, f in zip(r.step_s, r.matvec_floor_s))
    # One floor per round, shared by every batch size: weight bytes over that round's bandwidth.
    assert rows[0].floor_s == rows[1].floor_s and rows[0].matvec_floor_s == rows[1].matvec_floor_s
    assert all(f > 0 for f in rows[0].floor_s)
    assert weight_bytes(tiny_qwen3.model) > 0
    with pytest.raises(ValueError, match="num_rounds"):
        real_shape.step_vs_floor(tiny_qwen3.model, [1], num_rounds=0)


def test_token_time_rounds_alternate_and_time_the_decode_step(checkpoints):
    path = checkpoints["llama"].path
    llms = {name: LLM(path, strategy=name) for name in ("no_cache", "kv_cache")}
    rounds = token_time_rounds(llms, "Hello there", num_tokens=6, num_rounds=3, num_decode_steps=2)
    assert set(rounds.runs) == {"no_cache", "kv_cache"}
    assert all(len(runs) == 3 for runs in rounds.runs.values()) and len(rounds.decode_step_s) == 3
    # Same greedy tokens with and without the cache, every round.
    assert all(a.token_ids == b.token_ids for a, b in zip(rounds.runs["no_cache"], rounds.runs["kv_cache"]))
    prompt_len = rounds.runs["kv_cache"][0].num_prompt_tokens
    assert rounds.decode_context_len == prompt_len + 3
    fastest = rounds.fastest("kv_cache")
    assert fastest.latencies_s == [min(t) for t in zip(*(r.latencies_s for r in rounds.runs["kv_cache"]))]
    per_token = rounds.per_token_s("kv_cache")
    assert len(per_token) == 3 and all(t > 0 for t in per_token)
    with pytest.raises(ValueError, match="kv_cache"):
        token_time_rounds({"no_cache": llms["no_cache"]}, "Hello", 2)
