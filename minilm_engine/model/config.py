"""Model configuration: the handful of numbers that define a decoder, read from `config.json`.

Contract: `ModelConfig.from_hf_dict(d)` accepts the `config.json` of a Llama, Mistral, Qwen2 or
Qwen3 checkpoint (old `rope_scaling` + `rope_theta` keys or the newer `rope_parameters`) and
either returns a complete `ModelConfig` or raises `UnsupportedModelError` naming the problem.
Everything architecture-specific (qkv bias, q/k norm) is a field here, so the model code has
one `if` per feature instead of one class per family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# model_type -> the family-specific switches.  Llama and Mistral are the same decoder;
# Qwen2 adds a bias to the q/k/v projections; Qwen3 drops that bias and normalises q and k.
SUPPORTED_MODEL_TYPES: dict[str, dict[str, bool]] = {
    "llama": {"qkv_bias": False, "qk_norm": False},
    "mistral": {"qkv_bias": False, "qk_norm": False},
    "qwen2": {"qkv_bias": True, "qk_norm": False},
    "qwen3": {"qkv_bias": False, "qk_norm": True},
}

SUPPORTED_ROPE_TYPES = ("default", "llama3")


class UnsupportedModelError(ValueError):
    """The checkpoint describes a model this engine cannot run (architecture, rope type...)."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding settings.  `rope_type="llama3"` stretches low frequencies."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of a decoder-only transformer (Hugging Face names where they exist)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    rope: RopeConfig = field(default_factory=RopeConfig)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None  # the dtype the checkpoint was saved in, if it says

    @property
    def num_queries_per_kv(self) -> int:
        """How many query heads share one key/value head (1 = multi-head, >1 = GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    def num_parameters(self) -> int:
        """Parameter count computed from the shapes (embeddings counted once when tied)."""
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0)
        attn += 2 * d if self.qk_norm else 0
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h  # two RMSNorm weights
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return embed + self.num_hidden_layers * per_layer + h + head

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """KV cache bytes one token occupies: 2 (K and V) x layers x kv heads x head_dim x bytes."""
        return (
            2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * bytes_per_element
        )

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            arch = d.get("architectures") or ["?"]
            raise UnsupportedModelError(
                f"model_type {model_type!r} (architectures {arch}) is not supported; "
                f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        required = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"]
        missing = [k for k in required if k not in d]
        if missing:
            raise UnsupportedModelError(f"config.json is missing required keys: {missing}")
        if d.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(
                f"hidden_act {d['hidden_act']!r} is not supported; only 'silu' (SwiGLU) is")
        biased = [k for k in ("attention_bias", "mlp_bias") if d.get(k)]
        if biased:
            raise UnsupportedModelError(
                f"{model_type} checkpoints with {' and '.join(biased)}=true are not supported"
            )
        num_heads = d["num_attention_heads"]
        num_kv_heads = d.get("num_key_value_heads") or num_heads
        if num_heads % num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads ({num_heads}) must be a multiple of "
                f"num_key_value_heads ({num_kv_heads})"
            )
        if d.get("sliding_window") and d.get("use_sliding_window", model_type == "mistral"):
            # Mistral-style sliding windows only matter past the window; we do full attention.
            if d["sliding_window"] < d.get("max_position_embeddings", 0):
                raise UnsupportedModelError(
                    f"sliding_window={d['sliding_window']} attention is not supported")
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // num_heads,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            rope=_rope_from_hf(d),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=d.get("torch_dtype") or d.get("dtype"),
            **SUPPORTED_MODEL_TYPES[model_type],
        )


def _rope_from_hf(d: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters` (theta inside); older files write
    # `rope_theta` next to an optional `rope_scaling` dict.  Accept both.
    params = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}")
    if rope_type == "default":
        return RopeConfig(theta=float(theta))
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(params["factor"]),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=params.get("original_max_position_embeddings",
                                                    d.get("max_position_embeddings")),
    )

