"""Disaggregated prefill (vLLM's `distributed/kv_transfer`): a prefill engine and a decode engine,
the prompt's KV copied between their pools by the connector (kv_connector.py), a router in
front (disagg_router.py)."""

from minilm_engine.distributed.kv_transfer.disagg_router import DisaggRouter
from minilm_engine.distributed.kv_transfer.kv_connector import (
    InProcessKVConnector,
    KVTransfer,
    KVTransferStats,
    pack_kv,
    unpack_kv,
)

__all__ = ["DisaggRouter", "InProcessKVConnector", "KVTransfer", "KVTransferStats", "pack_kv", "unpack_kv"]
