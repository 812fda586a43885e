"""Shapes of well-known open models, as their `config.json` files publish them, for sizing by hand.

Contract: `KNOWN_CONFIGS` maps a Hugging Face repo id to the fields of that repo's `config.json`
that `ModelConfig.from_hf_dict` reads (ids and token ids included, weights nowhere): nothing
is downloaded, so chapters can compute KV-cache and weight sizes of real models offline.
`known_config(name)` returns the `ModelConfig`, and also accepts the shipped models' names
(read from the package's own checkpoints) and the part of an id after the slash.

Like gpt-fast's `transformer_configs` table, these are only shapes.  The numbers were copied
from the repos' `config.json` (tests pin the KV sizes and parameter counts the model cards
state, e.g. Llama-3-8B: 8.03B parameters and 128 KiB of KV cache per token in bf16).
"""

from __future__ import annotations

import json
from typing import Any

from minilm_engine.model.config import ModelConfig
from minilm_engine.model.loader import SHIPPED_MODELS, resolve_model_path

KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    # Qwen3: q/k RMSNorm, head_dim set explicitly (128, larger than hidden_size / heads = 64).
    "Qwen/Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "tie_word_embeddings": True,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen3-8B": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
    },
    # Qwen2.5: bias on q/k/v, 7 query heads per KV head.
    "Qwen/Qwen2.5-7B": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "torch_dtype": "bfloat16",
    },
    # Llama 2 7B: plain multi-head attention (as many KV heads as query heads), no GQA.
    "meta-llama/Llama-2-7b-hf": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float16",
    },
    "meta-llama/Meta-Llama-3-8B": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "torch_dtype": "bfloat16",
    },
    "meta-llama/Meta-Llama-3-70B": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "torch_dtype": "bfloat16",
    },
}


def shipped_config(name: str) -> ModelConfig:
    """The `ModelConfig` of a model this package ships ("noodle-chef", "noodle-apprentice")."""
    if name not in SHIPPED_MODELS:
        raise ValueError(f"{name!r} is not a shipped model; shipped: {', '.join(SHIPPED_MODELS)}")
    folder = resolve_model_path(name)
    return ModelConfig.from_hf_dict(json.loads((folder / "config.json").read_text()))


def known_config(name: str) -> ModelConfig:
    """`ModelConfig` for a shipped model, a `KNOWN_CONFIGS` id, or the part of an id after the
    slash ("Meta-Llama-3-8B"), case-insensitively."""
    if name in SHIPPED_MODELS:
        return shipped_config(name)
    wanted = name.lower()
    for repo_id, fields in KNOWN_CONFIGS.items():
        if wanted in (repo_id.lower(), repo_id.split("/")[1].lower()):
            return ModelConfig.from_hf_dict(fields)
    known = ", ".join([*SHIPPED_MODELS, *KNOWN_CONFIGS])
    raise KeyError(f"no known config for {name!r}; known: {known}")
