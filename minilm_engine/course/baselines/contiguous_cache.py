"""Contiguous KV caches: one big tensor per layer, every row reserved up to `max_len`.

Contract: a cache object is an `AttentionContext` for one model forward at a time.  Call
`begin_step(new_valid)` with which of the new tokens are real (False = padding), run the model
on the B x T batch flattened row by row (the model takes flat tokens; the cache folds its
(N, H, D) back into (B, T, H, D)), and the keys/values of those tokens stay in the cache for the
next step.

    slot:     0    1    2    3    4    5    6    7   ... max_len-1
    row 0:  [pad][pad][ t0 ][ t1 ][ t2 ][ t3 ][    ][    ]   <- left padding, never attended
    row 1:  [ t0 ][ t1 ][ t2 ][ t3 ][ t4 ][ t5 ][    ][    ]
                                           ^ next step writes here, for every row at once

This is the layout `transformers.generate` and static batching use: simple, but each row
reserves `max_len` slots whether or not its request ever gets that long (chapter 03 measures
that waste).  `NoKVCache` keeps nothing: every step recomputes the whole sequence (it is an
attention context over the step's tokens only, so it lives in `model/attention/`; named here too).
"""

from __future__ import annotations

import torch

from minilm_engine.model.attention import NoKVCache, attention, causal_mask
from minilm_engine.model.config import ModelConfig
from minilm_engine.pluggable import replaceable

__all__ = ["ContiguousKVCache", "NoKVCache", "forward_rows"]


def forward_rows(model, input_ids: torch.Tensor, positions: torch.Tensor, attn) -> torch.Tensor:
    """The model over a padded batch: input_ids, positions (B, T) -> hidden (B, T, hidden).  The
    model takes flat tokens; `attn` (a `ContiguousKVCache` or `NoKVCache` of B rows) folds them."""
    return model(input_ids.flatten(), positions.flatten(), attn).view(*input_ids.shape, -1)


class ContiguousKVCache:
    """K and V of shape (B, H_kv, max_len, D) per layer, filled left to right.

    Invariant: slots [0, num_used_slots) hold keys/values of earlier steps; `key_valid`
    marks which of them are real tokens.
    """

    def __init__(
        self,
        config: ModelConfig,
        batch_size: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        shape = (batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.key_valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.max_len = max_len
        self.num_used_slots = 0
        self._start = 0
        self._mask: torch.Tensor | None = None

    @property
    def num_bytes(self) -> int:
        """Bytes reserved by the cache (all of it, used or not)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def begin_step(self, new_valid: torch.Tensor) -> None:
        """new_valid: (B, T) bool, False for padding tokens of this step."""
        T = new_valid.shape[1]
        start, end = self.num_used_slots, self.num_used_slots + T
        if end > self.max_len:
            raise ValueError(f"KV cache full: {end} slots needed, {self.max_len} reserved")
        self.key_valid[:, start:end] = new_valid
        query_slots = torch.arange(start, end, device=new_valid.device)
        self._mask = causal_mask(self.key_valid[:, :end], query_slots)  # (B, T, end)
        self._start, self.num_used_slots = start, end

    def attend(self, layer_idx: int, q, k, v) -> torch.Tensor:
        """q: (N, H, D), k, v: (N, H_kv, D), N = B * T, row by row -> (N, H, D)."""
        batch_size = self.key_valid.shape[0]
        q, k, v = (x.view(batch_size, -1, *x.shape[1:]) for x in (q, k, v))  # (B, T, ., D)
        k_cache, v_cache = self.k[layer_idx], self.v[layer_idx]
        out = append_and_attend(k_cache, v_cache, self._start, q, k, v, self._mask)
        return out.flatten(0, 1)


@replaceable("kv_cache.append_and_attend")
def append_and_attend(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    start: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """One layer of one step: write this step's keys/values into slots [start, start + T) of the
    layer's cache, then let the step's queries attend over every slot up to there.

    k_cache, v_cache: (B, H_kv, max_len, D)    q: (B, T, H, D)    k, v: (B, T, H_kv, D)
    mask: (B, T, start + T) bool, True where query t may see slot s    returns (B, T, H, D)
    """
    end = start + q.shape[1]
    # (B, T, H_kv, D) -> (B, H_kv, T, D), written into this step's slots.
    k_cache[:, :, start:end] = k.transpose(1, 2)
    v_cache[:, :, start:end] = v.transpose(1, 2)
    out = attention(q.transpose(1, 2), k_cache[:, :, :end], v_cache[:, :, :end], mask)  # (B, H, T, D)
    return out.transpose(1, 2)
