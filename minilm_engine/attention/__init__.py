"""Attention math, kept apart from the model so that each KV-cache layout can reuse it."""

from .reference import AttentionContext, attention, causal_mask

__all__ = ["AttentionContext", "attention", "causal_mask"]
