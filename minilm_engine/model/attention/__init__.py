"""Attention math, kept apart from the model so that each KV-cache layout can reuse it."""

from minilm_engine.model.attention.reference import AttentionContext, NoKVCache, attention, causal_mask

__all__ = ["AttentionContext", "NoKVCache", "attention", "causal_mask"]
