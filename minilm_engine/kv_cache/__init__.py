"""Where the keys and values live: paged blocks (block_pool, block_manager)."""

from minilm_engine.kv_cache.block_manager import BlockManager
from minilm_engine.kv_cache.block_pool import BlockEvent, BlockEventLog, BlockPool, KVCacheBlock, hash_block_tokens

__all__ = ["BlockEvent", "BlockEventLog", "BlockManager", "BlockPool", "KVCacheBlock", "hash_block_tokens"]
