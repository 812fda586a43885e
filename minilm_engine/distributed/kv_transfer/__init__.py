"""Disaggregated prefill (vLLM's `distributed/kv_transfer`): a prefill engine (`kv_producer`) and
a decode engine (`kv_consumer`), the prompt's KV copied between their pools by a KV connector,
and a router in front.

    kv_connector.py    InProcessKVConnector: prefix lookup on the consumer, allocate, copy the
                       missing tokens' K and V slot by slot, commit, free the producer's blocks
    disagg_router.py   DisaggRouter: add_request / step / generate over the two engines
"""

from minilm_engine.distributed.kv_transfer.disagg_router import DisaggRouter
from minilm_engine.distributed.kv_transfer.kv_connector import (
    InProcessKVConnector,
    KVTransfer,
    KVTransferStats,
    pack_kv,
    unpack_kv,
)

__all__ = ["DisaggRouter", "InProcessKVConnector", "KVTransfer", "KVTransferStats", "pack_kv", "unpack_kv"]
