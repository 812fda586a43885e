"""CUDA graphs for decode steps: a whole forward pass replayed with one launch.

Contract: `DecodeGraphRunner(model, cache, backend, max_batch_size, max_blocks_per_seq)` runs
pure decode steps (one new token per sequence, at most `max_batch_size` sequences) and returns
the hidden states the eager forward returns, writing the same keys and values into the cache.
`capture()` (CUDA, Triton backend only: the torch reference plans every step on the host, and a
graph would replay the plan it recorded) records one graph per batch-size bucket; `run` then
replays the smallest bucket that fits.  Before `capture()` (or on a CPU) `run` executes the same
padded forward eagerly, which is how the CPU tests check the padding.

Why: a small model's decode step is launch-bound (Qwen3-0.6B: ~400 kernel launches a step, each
shorter than Python takes to issue the next); a replay issues them all in one call.  A graph
needs fixed shapes (a step of B sequences runs in the smallest bucket >= B, padded) and fixed
addresses (inputs are copied into static buffers, the output read from the graph's own tensor).
Padding rows feed token 0 at position 0, write to the cache's scratch block and attend over
that one slot:

    bucket 8, B = 5      rows 0..4: the step's sequences      rows 5..7: padding
    input_ids            t0 t1 t2 t3 t4                       0  0  0
    slot_mapping         s0 s1 s2 s3 s4                       x  x  x    x = scratch * block_size
    context_lens         l0 l1 l2 l3 l4                       1  1  1
    block_tables         each request's table                 [scratch, ...]
"""

from __future__ import annotations

import torch

from minilm_engine.model.attention.backends import AttentionBackend
from minilm_engine.model.attention.paged import PagedAttentionMetadata
from minilm_engine.core.kv_cache_utils import slot_mapping
from minilm_engine.model.attention.context import PagedAttention
from minilm_engine.model.attention.kv_cache import PagedKVCache
from minilm_engine.model import CausalLM


def capture_sizes(max_batch_size: int) -> list[int]:
    """Batch-size buckets, vLLM's pattern: 1, 2, 4, then every multiple of 8, up to the maximum."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    sizes = [b for b in (1, 2, 4) if b < max_batch_size] + list(range(8, max_batch_size, 8))
    return sizes + [max_batch_size]


class DecodeGraphRunner:
    """Padded, static-buffer decode forward; replayed from CUDA graphs once they are captured.

    Invariant: rows of the static buffers past the current batch always describe padding
    (scratch slot, context length 1), so any bucket can be replayed at any time.
    """

    def __init__(
        self,
        model: CausalLM,
        cache: PagedKVCache,
        backend: AttentionBackend | None,
        max_batch_size: int,
        max_blocks_per_seq: int,
    ):
        self.model = model
        self.cache = cache
        self.backend = backend
        self.buckets = capture_sizes(max_batch_size)
        # Padding rows write their token (position 0) into the scratch block.
        (self.pad_slot,) = slot_mapping([cache.scratch_block], cache.block_size, 0, 1)
        n, device = self.buckets[-1], model.device
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)  # (n,)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)  # (n,)
        self.slot_mapping = torch.full((n,), self.pad_slot, dtype=torch.long, device=device)
        self.context_lens = torch.ones(n, dtype=torch.long, device=device)  # (n,)
        self.block_tables = torch.full(
            (n, max_blocks_per_seq), cache.scratch_block, dtype=torch.long, device=device
        )  # (n, max_blocks_per_seq)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.long, device=device)  # one query each
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # bucket -> (bucket, hidden) the graph writes
        self.num_runs = 0  # decode steps run here
        self.num_replays = 0  # of which replayed from a graph

    @property
    def max_batch_size(self) -> int:
        return self.buckets[-1]

    def bucket_for(self, batch_size: int) -> int:
        return next(b for b in self.buckets if b >= batch_size)

    def can_run(self, num_tokens: int, meta: PagedAttentionMetadata) -> bool:
        """A pure decode step (one token per sequence) that fits the static buffers."""
        return (
            num_tokens == meta.num_seqs
            and 0 < meta.num_seqs <= self.max_batch_size
            and meta.block_tables.shape[1] <= self.block_tables.shape[1]
        )

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: PagedAttentionMetadata) -> torch.Tensor:
        """input_ids, positions: (B,) -> hidden states (B, hidden_size) of the decode step.

        The result is a view of the graph's output: read it before the next `run`.
        """
        num_seqs = input_ids.shape[0]
        bucket = self.bucket_for(num_seqs)
        self._load(input_ids, positions, meta)
        try:
            self.num_runs += 1
            graph = self.graphs.get(bucket)
            if graph is None:
                hidden = self.forward_bucket(bucket)
            else:
                graph.replay()
                self.num_replays += 1
                hidden = self.outputs[bucket]
        finally:
            # Even after an error: rows left holding real slots would let a later, smaller
            # step's padding write into a request's blocks.
            self._clear(num_seqs)
        return hidden[:num_seqs]

    @torch.inference_mode()
    def capture(self) -> None:
        """Record one CUDA graph per bucket, the largest first (the smaller graphs then fit into
        the memory pool the largest one reserved)."""
        if self.backend is None or self.backend.name != "triton":
            raise RuntimeError(
                "CUDA graphs need the Triton attention backend: the torch reference plans each step "
                "on the host, and a graph would replay the gather indices of the step it recorded"
            )
        device = self.model.device
        if device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA device; the model is on {device}")
        # Graphs, their memory pool and Triton's launches all follow the *current* device.
        with torch.cuda.device(device):
            pool = torch.cuda.graph_pool_handle()
            for bucket in reversed(self.buckets):
                # Warm-up outside the graph: Triton compiles on first call, which a capture forbids.
                self.forward_bucket(bucket)
                torch.cuda.synchronize(device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[bucket] = self.forward_bucket(bucket)
                self.graphs[bucket] = graph
            torch.cuda.synchronize(device)

    # -- the padded forward ---------------------------------------------------------------------

    def _load(self, input_ids, positions, meta: PagedAttentionMetadata) -> None:
        """Copy a step of B sequences into rows 0..B-1; rows from B on stay padding."""
        num_seqs, width = meta.block_tables.shape
        self.input_ids[:num_seqs].copy_(input_ids)
        self.positions[:num_seqs].copy_(positions)
        self.slot_mapping[:num_seqs].copy_(meta.slot_mapping)
        self.context_lens[:num_seqs].copy_(meta.context_lens)
        # Columns past `width` keep older block ids: every kernel stops at context_lens.
        self.block_tables[:num_seqs, :width].copy_(meta.block_tables)

    def _clear(self, num_seqs: int) -> None:
        """Turn rows 0..B-1 back into padding, restoring the class invariant."""
        self.input_ids[:num_seqs] = 0
        self.positions[:num_seqs] = 0
        self.slot_mapping[:num_seqs] = self.pad_slot
        self.context_lens[:num_seqs] = 1
        self.block_tables[:num_seqs, 0] = self.cache.scratch_block

    def forward_bucket(self, bucket: int) -> torch.Tensor:
        """The forward pass a graph records: the first `bucket` rows of the static buffers."""
        meta = PagedAttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket],
            query_start_loc=self.query_start_loc[: bucket + 1],
            context_lens=self.context_lens[:bucket],
            block_tables=self.block_tables[:bucket],
            max_query_len=1,
        )
        attn = PagedAttention(self.cache, meta, self.backend)
        return self.model(self.input_ids[:bucket], self.positions[:bucket], attn)  # (bucket, H)
