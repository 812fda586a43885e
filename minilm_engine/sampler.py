"""Logits -> next tokens.  The last step of every serving strategy.

Contract: `sample(logits, params, generators)` returns one token id per row.  Greedy rows take
the argmax; sampling rows apply temperature, then top-k, then top-p (vLLM's order), and draw
with the row's own seeded `torch.Generator`, so a request's output does not depend on which
other requests share its batch.
"""

from __future__ import annotations

import torch

from .sampling_params import SamplingParams


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits: (V,) -> the same logits with every token outside the kept set set to -inf."""
    if top_k and top_k < logits.shape[-1]:
        kth_best = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p: the kept set is
        # the smallest prefix whose probability mass is >= top_p (never empty).
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits: (V,) -> the distribution a sampling request draws from: temperature, then
    top-k, then top-p, then softmax.  (Speculative decoding applies it to both models.)"""
    return torch.softmax(apply_top_k_top_p(logits / params.temperature, params.top_k, params.top_p), dim=-1)


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """logits: (B, V) float32 -> (B,) int64 next-token ids."""
    next_tokens = logits.argmax(dim=-1)  # greedy for everyone; sampling rows overwrite below
    for row, (p, gen) in enumerate(zip(params, generators)):
        if p.greedy:
            continue
        next_tokens[row] = torch.multinomial(sampling_probs(logits[row], p), 1, generator=gen)[0]
    return next_tokens
