"""One decoder for the Llama, Mistral, Qwen2 and Qwen3 families.

Contract: `CausalLM(config)` has exactly the parameter names of the Hugging Face checkpoints
(`model.layers.0.self_attn.q_proj.weight`...), so loading is a name-for-name copy.
`forward(input_ids (N,), positions (N,), attn)` returns hidden states (N, hidden), the step's
tokens flat (no batch axis); `compute_logits(hidden)` turns the rows you need into vocabulary
scores.  Attention is delegated to `attn` (an `AttentionContext`): the model never knows which
serving strategy or cache layout runs it.

    input_ids ─ embed ─┬─ [RMSNorm ─ attention ─ +] ─ [RMSNorm ─ SwiGLU MLP ─ +] ─ ... ─ RMSNorm ─ lm_head
                       └──────── residual ───────┘ x num_hidden_layers
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minilm_engine.model.attention import AttentionContext
from minilm_engine.model.config import ModelConfig
from minilm_engine.model.rope import RotaryEmbedding, apply_rotary


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (..., D) / rms(x) * weight (D,) (or any shape that broadcasts), computed in float32 like
    the reference implementations, rounded back to x's dtype before the weight."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class RMSNorm(nn.Module):
    """`rms_norm` with a learned weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        h, q_dim, kv_dim = config.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(h, q_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, kv_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, kv_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_dim, h, bias=False)
        # Qwen3 normalises each head of q and k before the rotation (keeps logits tame).
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, attn: AttentionContext) -> torch.Tensor:
        num_tokens = x.shape[0]
        q = self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim)  # (N, H, D)
        k = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)  # (N, H_kv, D)
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = attn.attend(self.layer_idx, q, k, v)  # (N, H, D)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, attn: AttentionContext) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.quantization_config = None  # a quantization.QuantizationConfig when quantized

    def tie_weights(self) -> None:
        """Small models share the input embedding with the output head (unless it is quantized)."""
        if self.config.tie_word_embeddings and isinstance(self.lm_head, nn.Linear):
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext):
        """input_ids, positions: (N,), every sequence's tokens of the step side by side ->
        final hidden states (N, hidden_size)."""
        x = self.model.embed_tokens(input_ids)  # (N, hidden)
        cos, sin = self.model.rotary(positions, x.dtype)  # (N, head_dim) each
        for layer in self.model.layers:
            x = layer(x, cos, sin, attn)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., hidden_size) -> (..., vocab_size) float32 scores."""
        return self.lm_head(hidden).float()
