"""The readable definition of attention, with grouped-query heads.

Contract: `attention(q, k, v, mask)` is plain softmax(q k^T / sqrt(d)) v in float32 softmax,
the reference every faster backend is tested against.  `AttentionContext` is the one method
the model needs from whoever owns the keys and values: the model hands over this step's q, k, v
for a layer and gets the attention output back, without knowing whether the keys live nowhere
(recompute: `NoKVCache`, below), in a contiguous tensor, or in pages.
"""

from __future__ import annotations

from typing import Protocol

import torch


class AttentionContext(Protocol):
    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> torch.Tensor:
        """q: (N, H, D), k and v: (N, H_kv, D) for this step's N tokens -> (N, H, D).  A context
        that serves a padded batch of B rows knows B and reshapes (N = B * T) itself."""
        ...


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Masked multi-head attention where H_kv key/value heads serve H query heads.

    q: (B, H, T, D)      the queries of this step's T tokens
    k, v: (B, H_kv, S, D) every key/value the queries may look at (S >= T)
    mask: (B, T, S) bool, True where query t may attend to key s
    returns (B, H, T, D)
    """
    B, num_heads, T, D = q.shape
    num_kv_heads, S = k.shape[1], k.shape[2]
    # Grouped-query attention: each K/V head serves a group of query heads (query head h uses
    # K/V head h // group).  Folding each group's queries into one matrix lets every K/V head
    # be read once, without copying it `group` times.
    group = num_heads // num_kv_heads
    q = q.reshape(B, num_kv_heads, group * T, D)  # rows: (query head in group, token)
    scores = (q @ k.transpose(-1, -2)) * D**-0.5  # (B, H_kv, group * T, S)
    # The same mask for every query head of a group: broadcast over the group, not copied.
    scores = scores.view(B, num_kv_heads, group, T, S).masked_fill(~mask[:, None, None], float("-inf"))
    # Softmax in float32: in fp16 the exponentials of long rows lose too much precision.
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(B, num_kv_heads, group * T, S)
    return (probs @ v).reshape(B, num_heads, T, D)


def causal_mask(key_valid: torch.Tensor, query_slots: torch.Tensor) -> torch.Tensor:
    """key_valid (B, S) bool (False for padding), query_slots (T,) -> (B, T, S) bool: each
    query sees the real keys at or before its slot, and its own slot (a padding query too, so
    no softmax row is empty: an all-masked row gives NaN, which a zero weight lets through)."""
    key_slots = torch.arange(key_valid.shape[1], device=key_valid.device)
    not_future = key_slots[None, :] <= query_slots[:, None]  # (T, S)
    is_self = key_slots[None, :] == query_slots[:, None]  # (T, S)
    return not_future[None] & (key_valid[:, None, :] | is_self[None])


class NoKVCache:
    """Attention over this step's tokens only: nothing is kept, so every step starts over.
    `valid` (B, T) bool, False for padding: the model's N = B * T tokens are B rows of T."""

    def __init__(self, valid: torch.Tensor):
        self.batch_size, T = valid.shape
        self._mask = causal_mask(valid, torch.arange(T, device=valid.device))

    def attend(self, layer_idx: int, q, k, v) -> torch.Tensor:
        # (N, ., D) -> (B, ., T, D)
        q, k, v = (x.view(self.batch_size, -1, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))
        return attention(q, k, v, self._mask).transpose(1, 2).flatten(0, 1)  # (N, H, D)
