"""Rotary position embeddings (RoPE): position enters attention as a rotation of q and k.

Contract: `RotaryEmbedding(rope, head_dim)(positions)` returns `(cos, sin)` for any tensor of
integer positions, and `apply_rotary(x, cos, sin)` rotates q or k.  The arithmetic follows
`transformers` step for step (float32 frequencies, `rotate_half` layout) so our logits match.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from minilm_engine.model.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """(head_dim // 2,) rotation speeds theta^(-2i/d); llama3 scaling slows long wavelengths."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "default":
        return inv_freq
    # Llama 3.1: long wavelengths divided by `factor`, short ones kept, the band between smoothed.
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    band = rope.high_freq_factor - rope.low_freq_factor
    smooth = (old_len / wavelen - rope.low_freq_factor) / band
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.register_buffer("inv_freq", inverse_frequencies(rope, head_dim), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        # positions: (N,) int  ->  cos, sin: (N, head_dim)
        freqs = positions[..., None].float() * self.inv_freq.float()
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (N, H, D); cos, sin: (N, D) -> rotated x, same shape."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
    return x * cos + rotate_half(x) * sin
