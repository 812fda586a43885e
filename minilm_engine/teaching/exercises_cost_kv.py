"""The "Your turn" exercises of chapters 00 (the ledger) and 02 (the KV cache).

Each is an `Exercise` whose reference is the package's own function; the random cases are
built so that the usual slips fail: per-second vs per-hour prices, query heads used instead of
KV heads, `hidden_size / num_heads` used instead of `head_dim`, forgetting the weights.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..experiments.cost import cost_per_million_tokens
from ..experiments.kv_growth import kv_bytes_per_token, max_cached_tokens
from ..models.config import ModelConfig
from .exercises import Exercise


@dataclass(frozen=True, repr=False)
class _CaseConfig(ModelConfig):
    """A `ModelConfig` that prints only the shapes an exercise is about."""

    def __repr__(self) -> str:
        return (
            f"ModelConfig(num_hidden_layers={self.num_hidden_layers}, "
            f"num_attention_heads={self.num_attention_heads}, "
            f"num_key_value_heads={self.num_key_value_heads}, head_dim={self.head_dim}, "
            f"hidden_size={self.hidden_size}, ...)"
        )


def random_config(rng: random.Random) -> ModelConfig:
    """A plausible decoder: GQA most of the time, and a head_dim that is often not
    hidden_size / num_attention_heads (as in Qwen3)."""
    num_kv_heads = rng.choice([1, 2, 4, 8, 8, 16])
    num_heads = num_kv_heads * rng.choice([1, 2, 4, 7, 8])
    head_dim = rng.choice([32, 64, 80, 96, 128, 128, 256])
    hidden_size = num_heads * rng.choice([head_dim, head_dim // 2, 64])
    return _CaseConfig(
        model_type="llama",
        vocab_size=rng.choice([1497, 32000, 128256, 151936]),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * rng.choice([2, 3, 4]),
        num_hidden_layers=rng.randint(1, 96),
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
    )


def _cost_case(rng: random.Random) -> dict:
    return {
        "price_per_hour": round(rng.uniform(0.02, 12.0), 2),
        "tokens_per_second": round(rng.uniform(1.0, 20_000.0), 1),
    }


def _kv_case(rng: random.Random) -> dict:
    return {"config": random_config(rng), "bytes_per_element": rng.choice([1, 2, 2, 4])}


def _fit_case(rng: random.Random) -> dict:
    case = _kv_case(rng)
    weights = case["config"].num_parameters() * case["bytes_per_element"]
    # Mostly room to spare, sometimes not even room for the weights.
    scale = rng.choice([0.5, 1.0, 1.3, 2.0, 10.0])
    case["memory_bytes"] = int(weights * scale) + rng.randint(0, 1 << 20)
    return case


def _close(got, want) -> bool:
    return isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-9)


COST_PER_MILLION = Exercise(
    "cost_per_million_tokens(price_per_hour, tokens_per_second)",
    reference=cost_per_million_tokens,
    make_case=_cost_case,
    compare=_close,
    hint="A machine rented by the hour produces tokens_per_second * 3600 tokens in that hour.",
)

KV_BYTES_PER_TOKEN = Exercise(
    "kv_bytes_per_token(config, bytes_per_element)",
    reference=kv_bytes_per_token,
    make_case=_kv_case,
    hint="Every layer stores one key and one value vector of head_dim numbers per KV head "
    "(num_key_value_heads, not num_attention_heads).",
)

MAX_CACHED_TOKENS = Exercise(
    "max_cached_tokens(config, memory_bytes, bytes_per_element)",
    reference=max_cached_tokens,
    make_case=_fit_case,
    hint="First the weights (config.num_parameters() numbers) take their share; what is left, "
    "divided by the KV bytes of one token and rounded down, is the answer (never below 0).",
)
