"""The "Your turn" exercises of chapters 00 (the ledger) and 02 (the KV cache).

The stored cases are built so that the usual slips fail: per-second vs per-hour prices, query
heads used instead of KV heads, `hidden_size / num_heads` used instead of `head_dim`,
forgetting the weights.  Chapter 02's functions receive an `ExerciseConfig`: the shapes of a
model and its parameter count, but not `ModelConfig.kv_bytes_per_token`, so the answer has to
be worked out rather than looked up.

    make_cost_case / make_kv_case / make_fit_case   random JSON cases (for the fixtures)
    model_config(raw)                               the full ModelConfig a case describes
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from minilm_engine.model.config import ModelConfig
from minilm_engine.course.teaching.exercises import Exercise, close

SHAPE_FIELDS = (
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "hidden_size", "intermediate_size", "vocab_size",
)


@dataclass(frozen=True)
class ExerciseConfig:
    """The fields of a `config.json` an exercise is about, and the parameter count."""

    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    parameters: int

    def num_parameters(self) -> int:
        return self.parameters

    def __repr__(self) -> str:
        return (
            f"config(num_hidden_layers={self.num_hidden_layers}, "
            f"num_attention_heads={self.num_attention_heads}, "
            f"num_key_value_heads={self.num_key_value_heads}, head_dim={self.head_dim}, "
            f"hidden_size={self.hidden_size}, num_parameters()={self.parameters:,})"
        )


def model_config(raw: dict[str, Any]) -> ModelConfig:
    """The `ModelConfig` whose shapes a stored case lists."""
    return ModelConfig(
        model_type="llama", max_position_embeddings=4096, **{k: raw[k] for k in SHAPE_FIELDS}
    )


def _decode_config(raw: dict[str, Any]) -> dict[str, Any]:
    case = dict(raw)
    shapes = {k: raw["config"][k] for k in SHAPE_FIELDS}
    case["config"] = ExerciseConfig(**shapes, parameters=model_config(shapes).num_parameters())
    return case


def random_shapes(rng: random.Random) -> dict[str, int]:
    """A plausible decoder: GQA most of the time, and a head_dim that is often not
    hidden_size / num_attention_heads (as in Qwen3)."""
    num_kv_heads = rng.choice([1, 2, 4, 8, 8, 16])
    num_heads = num_kv_heads * rng.choice([1, 2, 4, 7, 8])
    head_dim = rng.choice([32, 64, 80, 96, 128, 128, 256])
    hidden_size = num_heads * rng.choice([head_dim, head_dim // 2, 64])
    return {
        "num_hidden_layers": rng.randint(1, 96),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * rng.choice([2, 3, 4]),
        "vocab_size": rng.choice([1497, 32000, 128256, 151936]),
    }


def make_cost_case(rng: random.Random) -> dict:
    return {
        "price_per_hour": round(rng.uniform(0.02, 12.0), 2),
        "tokens_per_second": round(rng.uniform(1.0, 20_000.0), 1),
    }


def make_kv_case(rng: random.Random) -> dict:
    return {"config": random_shapes(rng), "bytes_per_element": rng.choice([1, 2, 2, 4])}


def make_fit_case(rng: random.Random) -> dict:
    case = make_kv_case(rng)
    weights = model_config(case["config"]).num_parameters() * case["bytes_per_element"]
    # Mostly room to spare, sometimes not even room for the weights.
    scale = rng.choice([0.5, 1.0, 1.3, 2.0, 10.0])
    case["memory_bytes"] = int(weights * scale) + rng.randint(0, 1 << 20)
    return case


COST_PER_MILLION = Exercise(
    "cost_per_million_tokens(price_per_hour, tokens_per_second)",
    "cost_per_million_tokens",
    compare=close,
    hint="A machine rented by the hour produces tokens_per_second * 3600 tokens in that hour.",
    shows=("minilm_engine.course.experiments.cost:cost_per_million_tokens",),
    solutions="00_noodle_shop_solutions.ipynb",
)

KV_BYTES_PER_TOKEN = Exercise(
    "kv_bytes_per_token(config, bytes_per_element)",
    "kv_bytes_per_token",
    decode=_decode_config,
    hint="Every layer stores one key and one value vector of head_dim numbers per KV head "
    "(num_key_value_heads, not num_attention_heads).",
    shows=("minilm_engine.course.experiments.kv_growth:kv_bytes_per_token",),
    solutions="02_kv_cache_solutions.ipynb",
)

MAX_CACHED_TOKENS = Exercise(
    "max_cached_tokens(config, memory_bytes, bytes_per_element)",
    "max_cached_tokens",
    decode=_decode_config,
    hint="First the weights (config.num_parameters() numbers) take their share; what is left, "
    "divided by the KV bytes of one token and rounded down, is the answer (never below 0).",
    shows=("minilm_engine.course.experiments.kv_growth:max_cached_tokens",),
    solutions="02_kv_cache_solutions.ipynb",
)
