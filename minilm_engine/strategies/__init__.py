"""Serving strategies the chapters compare, all behind `LLM(..., strategy=NAME)`.

Each is a small file: who runs when, and where the keys and values live.
"""

from .base import Strategy
from .continuous import ContinuousStrategy
from .kv_cache import KVCacheStrategy
from .no_cache import NoCacheStrategy
from .static_batch import StaticBatchStrategy

STRATEGIES: dict[str, type[Strategy]] = {
    "no_cache": NoCacheStrategy,
    "kv_cache": KVCacheStrategy,
    "static_batch": StaticBatchStrategy,
    "continuous": ContinuousStrategy,
}

__all__ = ["STRATEGIES", "ContinuousStrategy", "KVCacheStrategy", "NoCacheStrategy", "StaticBatchStrategy", "Strategy"]
