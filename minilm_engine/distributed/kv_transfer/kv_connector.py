"""The KV connector: a prompt's keys and values, copied from a producer's pool into a consumer's.

Contract: `InProcessKVConnector(kv_producer, kv_consumer)` joins two `LLMEngine`s of one model
in one process (checked when built; the block sizes may differ).  `transfer(request)` moves a
request the producer has prefilled, sampled one token of, and detached:

    1. look its tokens up in the consumer's prefix cache (no side effect, like vLLM's
       `get_num_new_matched_tokens`): the first `num_cached` tokens are not sent;
    2. allocate the consumer's block table for the prompt; no batch slot or too few blocks:
       return None, nothing changed (the caller tries again later);
    3. copy K and V of positions [num_cached, num_prompt_tokens), every layer, gathered into one
       buffer (what would cross the link) and scattered into the consumer's slots;
    4. commit the consumer's full prompt blocks, free the producer's, admit the request to the
       consumer (`LLMEngine.add_computed_request`): its next step there is a decode.

    producer, block_size 4                 the wire                  consumer, block_size 8
    table [3, 9, 1], 10 prompt tokens      (L, 2, n, H_kv, D)        no hit: table [5, 2]
    slots 12 13 14 15 | 36 .. 39 | 4 5 ──> n = 10 - num_cached ──>   slots 40 .. 47 | 16 17

Copying slot by slot is why the block sizes may differ.  In one process the `Request` object
itself moves, so a seeded request keeps its generator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from minilm_engine.entrypoints.llm_engine import LLMEngine
from minilm_engine.model.attention.kv_cache import PagedKVCache
from minilm_engine.core.request import Request


def pack_kv(cache: PagedKVCache, slots: list[int]) -> torch.Tensor:
    """The keys and values of `slots`, every layer, in one tensor (L, 2, n, H_kv, D)."""
    k0 = cache.k[0]
    index = torch.tensor(slots, dtype=torch.long, device=k0.device)
    wire = torch.empty((len(cache.k), 2, len(slots), *k0.shape[2:]), dtype=k0.dtype, device=k0.device)
    for layer, (k, v) in enumerate(zip(cache.k, cache.v)):
        # A layer's cache (num_blocks + 1, block_size, H_kv, D) seen as (slots, H_kv, D): slot
        # s = block_id * block_size + offset is row s (`worker/block_table.py`).
        torch.index_select(k.flatten(0, 1), 0, index, out=wire[layer, 0])
        torch.index_select(v.flatten(0, 1), 0, index, out=wire[layer, 1])
    return wire


def unpack_kv(cache: PagedKVCache, slots: list[int], wire: torch.Tensor) -> None:
    """Write `wire` (L, 2, n, H_kv, D), as `pack_kv` made it, into `slots` of `cache`."""
    index = torch.tensor(slots, dtype=torch.long, device=cache.k[0].device)
    for layer, (k, v) in enumerate(zip(cache.k, cache.v)):
        k.flatten(0, 1).index_copy_(0, index, wire[layer, 0])  # a view: writes into the cache
        v.flatten(0, 1).index_copy_(0, index, wire[layer, 1])


@dataclass(frozen=True)
class KVTransfer:
    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int  # already in the consumer's prefix cache: not sent
    num_bytes: int  # K and V of the tokens sent, every layer
    seconds: float  # gather, copy and scatter, measured

    @property
    def num_tokens(self) -> int:  # whose KV was sent
        return self.num_prompt_tokens - self.num_cached_tokens


@dataclass
class KVTransferStats:
    """Every hand-over so far, and their totals."""

    transfers: list[KVTransfer] = field(default_factory=list)

    @property
    def num_requests(self) -> int:
        return len(self.transfers)

    @property
    def num_tokens(self) -> int:
        return sum(t.num_tokens for t in self.transfers)

    @property
    def num_cached_tokens(self) -> int:
        return sum(t.num_cached_tokens for t in self.transfers)

    @property
    def num_bytes(self) -> int:
        return sum(t.num_bytes for t in self.transfers)


class InProcessKVConnector:
    """Copies KV from `kv_producer`'s pool into `kv_consumer`'s (module docstring)."""

    def __init__(self, kv_producer: LLMEngine, kv_consumer: LLMEngine):
        check_compatible(kv_producer, kv_consumer)
        self.kv_producer = kv_producer
        self.kv_consumer = kv_consumer
        self.stats = KVTransferStats()

    def transfer(self, request: Request) -> KVTransfer | None:
        """Hand a detached request over (steps 1-4); None if the consumer has no room now."""
        producer, consumer = self.kv_producer, self.kv_consumer
        rid, num_prompt = request.request_id, request.num_prompt_tokens
        if request.num_computed_tokens != num_prompt or len(request.output_token_ids) != 1:
            raise ValueError(
                f"request {rid!r}: a hand-over carries a computed prompt and one sampled token, "
                f"got {request.num_computed_tokens} of {num_prompt} prompt tokens computed and "
                f"{len(request.output_token_ids)} output tokens"
            )
        if not consumer.can_add_computed_request():
            return None
        # 1. The consumer's prefix hit.  Looking up the prompt plus its first token lets a prompt
        # that fills whole blocks hit all of them (a lookup never covers its last token).
        manager = consumer.block_manager
        hashes = request.block_hashes.setdefault(manager.block_size, [])
        hit_blocks, num_cached = manager.get_computed_blocks(request.all_token_ids, hashes)
        # 2. The consumer's table for the prompt (the decode steps add blocks as they go).
        if not manager.allocate_slots(rid, num_cached, num_prompt - num_cached, hit_blocks):
            return None
        # 3. The copy: the producer's slots -> one buffer -> the consumer's slots.
        start = time.perf_counter()
        src = producer.block_manager.slot_mapping(rid, num_cached, num_prompt)
        dst = manager.slot_mapping(rid, num_cached, num_prompt)
        wire = pack_kv(producer.cache, src)  # (L, 2, n, H_kv, D)
        unpack_kv(consumer.cache, dst, wire)
        if wire.device.type == "cuda":
            torch.cuda.synchronize(wire.device)
        seconds = time.perf_counter() - start
        # 4. Commit, free the producer's side, admit.
        manager.commit(rid, request.all_token_ids, num_prompt)
        try:
            consumer.add_computed_request(request)
        except (ValueError, KeyError):
            manager.free(rid)
            raise
        producer.block_manager.free(rid)
        record = KVTransfer(rid, num_prompt, num_cached, wire.numel() * wire.element_size(), seconds)
        self.stats.transfers.append(record)
        return record


def check_compatible(kv_producer: LLMEngine, kv_consumer: LLMEngine) -> None:
    """Raise ValueError unless the consumer can read the producer's KV as its own."""
    a, b = kv_producer.model.config, kv_consumer.model.config
    for name in ("num_hidden_layers", "num_key_value_heads", "head_dim", "vocab_size"):
        if getattr(a, name) != getattr(b, name):
            raise ValueError(
                f"the producer and consumer run different models: {name} is {getattr(a, name)} "
                f"and {getattr(b, name)}; both engines must load the same checkpoint"
            )
    pairs = {
        "KV dtype": (kv_producer.cache.k[0].dtype, kv_consumer.cache.k[0].dtype),
        "device": (kv_producer.cache.k[0].device, kv_consumer.cache.k[0].device),
        "max_model_len": (kv_producer.max_model_len, kv_consumer.max_model_len),
    }
    for name, (x, y) in pairs.items():
        if x != y:
            raise ValueError(f"the producer and consumer differ in {name}: {x} and {y}")
    for role, engine in (("producer", kv_producer), ("consumer", kv_consumer)):
        if engine.config.speculative_config is not None:
            raise ValueError(
                f"the KV {role} has a speculative_config; disaggregated prefill runs without "
                f"speculative decoding (the draft's own KV would have to move too)"
            )
