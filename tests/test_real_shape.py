"""course/experiments/real_shape.py: a Qwen3-0.6B-shaped model with random weights, written once; its decode
step against its weight-read floors; and kv_growth.token_time_rounds (chapter 02's alternating rounds).
Behaviour only: shapes, pairing and counts, never a timing of this machine."""

from __future__ import annotations

import pytest
import torch

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.model.device import native_bf16_matmul
from minilm_engine.course.experiments import real_shape
from minilm_engine.course.experiments.kv_growth import token_time_rounds
from minilm_engine.course.known_configs import KNOWN_CONFIGS


def test_fields_are_qwen3_0_6b_with_the_layers_asked_for() -> None:
    known = KNOWN_CONFIGS[real_shape.MODEL_ID]
    fields = real_shape.qwen3_fields(3)
    assert fields["num_hidden_layers"] == 3
    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "vocab_size"):
        assert fields[name] == known[name]
    assert real_shape.qwen3_fields()["num_hidden_layers"] == known["num_hidden_layers"]
    with pytest.raises(ValueError, match="num_layers"):
        real_shape.qwen3_fields(0)


@pytest.mark.slow
def test_the_checkpoint_is_written_once_and_loads_in_this_machines_dtype(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MINILM_CACHE", str(tmp_path))
    folder = real_shape.random_qwen3_folder(1)
    assert folder.parent == tmp_path and not list(tmp_path.glob("*.partial"))
    written = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert real_shape.random_qwen3_folder(1) == folder
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == written  # not written again
    llm = real_shape.load_random_qwen3(1, max_model_len=64, num_kv_blocks=8)
    expected = torch.bfloat16 if native_bf16_matmul() else torch.float32
    assert llm.dtype == expected and llm.config.num_hidden_layers == 1
    assert real_shape.load_random_qwen3(1, max_model_len=64, num_kv_blocks=8, dtype="bfloat16").dtype == torch.bfloat16
    assert llm.config.hidden_size == KNOWN_CONFIGS[real_shape.MODEL_ID]["hidden_size"]
    out = llm.generate(["Order for table 7:"], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)  # noise tokens
    assert len(out[0].outputs[0].token_ids) == 2


@pytest.mark.parametrize("native, expected", [(True, "bfloat16"), (False, "float32")])
def test_the_default_dtype_is_bf16_only_where_the_cpu_multiplies_it_natively(monkeypatch, native, expected) -> None:
    monkeypatch.setattr(real_shape, "native_bf16_matmul", lambda: native)
    assert real_shape.default_dtype("cpu") == expected


def test_matvec_bandwidth_counts_the_weight_bytes_it_streams():
    rate = real_shape.measure_matvec_bandwidth(64, torch.bfloat16, num_bytes=1 << 20, num_repeats=2)
    assert rate > 0
    assert real_shape.measure_matvec_bandwidth(64, torch.float32, num_bytes=8, num_repeats=1) > 0  # one row at least


def test_step_vs_floor_pairs_each_round(checkpoints):
    tiny_qwen3 = LLM(checkpoints["qwen3"].path)
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
    with pytest.raises(ValueError, match="num_rounds"):
        real_shape.step_vs_floor(tiny_qwen3.model, [1], num_rounds=0)


def test_token_time_rounds_alternate_and_time_the_decode_step(checkpoints):
    path = checkpoints["llama"].path
    llms = {name: BaselineLLM(path, strategy=name) for name in ("no_cache", "kv_cache")}
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
