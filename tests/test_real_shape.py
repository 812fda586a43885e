"""experiments/real_shape.py: a Qwen3-0.6B-shaped model with random weights, written once."""

from __future__ import annotations

import pytest
import torch

from minilm_engine import SamplingParams
from minilm_engine.experiments import real_shape
from minilm_engine.models.known_configs import KNOWN_CONFIGS


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
def test_the_checkpoint_is_written_once_and_loads_in_bf16(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MINILM_CACHE", str(tmp_path))
    folder = real_shape.random_qwen3_folder(1)
    assert folder.parent == tmp_path and not list(tmp_path.glob("*.partial"))
    written = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert real_shape.random_qwen3_folder(1) == folder
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == written  # not written again
    llm = real_shape.load_random_qwen3(1, max_model_len=64, num_kv_blocks=8)
    assert llm.dtype == torch.bfloat16 and llm.config.num_hidden_layers == 1
    assert llm.config.hidden_size == KNOWN_CONFIGS[real_shape.MODEL_ID]["hidden_size"]
    out = llm.generate(["Order for table 7:"], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)  # noise tokens
    assert len(out[0].outputs[0].token_ids) == 2
