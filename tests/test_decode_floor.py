"""course/experiments/decode_floor: a model's decode step against its weight-read floor."""

from __future__ import annotations

import statistics

import pytest

from minilm_engine.course.experiments import decode_floor
from minilm_engine.course.experiments.quantization import Setting, write_random_qwen3


def test_settings_vs_floor_puts_each_step_next_to_its_weight_bytes(tmp_path):
    write_random_qwen3(tmp_path, vocab_size=2048,  # the shipped tokenizer's ids fit
                       hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                       bos_token_id=1, eos_token_id=2)
    bandwidth = 1e10
    table = decode_floor.settings_vs_floor(tmp_path, [Setting("bf16", dtype="bfloat16"),
                                                     Setting("int8", "int8", dtype="bfloat16")],
                                          num_tokens=3, repeats=2, bandwidth=bandwidth)
    assert list(table.index) == ["bf16", "int8"] and table.attrs["bandwidth"] == bandwidth
    assert table.loc["int8", "weight_bytes"] < table.loc["bf16", "weight_bytes"]
    for _, row in table.iterrows():
        assert row["step ms"] == pytest.approx(1e3 / row["tokens_per_s"])
        assert row["floor ms"] == pytest.approx(1e3 * row["weight_bytes"] / bandwidth)
        assert row["step / floor"] == pytest.approx(row["step ms"] / row["floor ms"])
    # The baseline's speed: its own runs and the runs paired with the other setting's (4 in all).
    base = table.loc["bf16"]
    assert len(base["runs"]) == 4 and base["tokens_per_s"] == pytest.approx(statistics.median(base["runs"]))
    int8 = table.loc["int8"]
    assert [s / r for s, r in zip(int8["runs"], int8["ratios"])] == pytest.approx(base["runs"][2:])
