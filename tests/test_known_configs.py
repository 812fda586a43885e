"""Tests for minilm_engine.course.known_configs: published shapes load and match the model cards."""

from __future__ import annotations

import pytest
import torch

from minilm_engine import LLM
from minilm_engine.model import ModelConfig
from minilm_engine.course.known_configs import KNOWN_CONFIGS, known_config, shipped_config

# repo id -> (parameters the model card / safetensors index states, KV KiB per token in bf16)
PUBLISHED = {
    "Qwen/Qwen3-0.6B": (596_049_920, 112),
    "Qwen/Qwen3-8B": (8_190_735_360, 144),
    "Qwen/Qwen2.5-7B": (7_615_616_512, 56),
    "meta-llama/Llama-2-7b-hf": (6_738_415_616, 512),
    "meta-llama/Meta-Llama-3-8B": (8_030_261_248, 128),
    "meta-llama/Meta-Llama-3-70B": (70_553_706_496, 320),
}


def test_the_table_is_what_the_tests_pin() -> None:
    assert set(KNOWN_CONFIGS) == set(PUBLISHED)


@pytest.mark.parametrize("repo_id", sorted(PUBLISHED))
def test_published_sizes(repo_id: str) -> None:
    config = known_config(repo_id)
    num_params, kv_kib = PUBLISHED[repo_id]
    assert config.num_parameters() == num_params
    assert config.kv_bytes_per_token(2) == kv_kib * 1024


def test_llama3_8b_by_hand() -> None:
    config = known_config("Meta-Llama-3-8B")
    assert (config.num_hidden_layers, config.num_key_value_heads, config.head_dim) == (32, 8, 128)
    assert config.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    qwen = known_config("qwen3-0.6b")
    assert (qwen.num_hidden_layers, qwen.num_key_value_heads, qwen.head_dim) == (28, 8, 128)
    assert qwen.qk_norm and not qwen.qkv_bias and qwen.tie_word_embeddings


@pytest.mark.parametrize("repo_id", sorted(PUBLISHED))
def test_transformers_builds_the_same_model(repo_id: str) -> None:
    """The dicts are valid config.json contents: transformers builds (on the meta device, no
    memory) a model with exactly the parameter count our ModelConfig computes."""
    transformers = pytest.importorskip("transformers")
    fields = dict(KNOWN_CONFIGS[repo_id])
    hf_config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    assert sum(p.numel() for p in model.parameters()) == known_config(repo_id).num_parameters()


def test_names_are_matched_case_insensitively() -> None:
    assert known_config("meta-llama/Meta-Llama-3-70B") == known_config("meta-llama-3-70b")
    with pytest.raises(KeyError, match="known: noodle-chef"):
        known_config("gpt-5")


def test_shipped_configs_match_the_loaded_models() -> None:
    chef = shipped_config("noodle-chef")
    assert known_config("noodle-chef") == chef
    assert chef.num_parameters() == LLM("noodle-chef").num_parameters == 7_118_720
    assert chef.kv_bytes_per_token(4) == 2 * 6 * 1 * 64 * 4
    assert isinstance(shipped_config("noodle-apprentice"), ModelConfig)
    with pytest.raises(ValueError, match="not a shipped model"):
        shipped_config("Qwen/Qwen3-0.6B")
