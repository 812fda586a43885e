"""One engine step on the model: flatten the scheduled tokens, run, sample.

Contract: `ModelRunner.execute(scheduled)` computes keys/values for every scheduled token into
the paged cache and returns, per scheduled request, the sampled next token, or None when the
step only computed part of a prompt (a chunk) and there is nothing to sample yet.

    scheduled:    A: 4 prompt tokens   B: 1 decode token   C: 2 of 5 prompt tokens (a chunk)
    input_ids:    [ a0 a1 a2 a3 | b7 | c0 c1 ]          one row, no padding
    positions:    [  0  1  2  3 |  7 |  0  1 ]
    logits taken at:         ^a3   ^b7          (C samples nothing until its prompt is done)
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from ..attention.backends import AttentionBackend
from ..kv_cache.block_manager import BlockManager
from ..attention.paged import PagedAttentionMetadata
from ..kv_cache.paged import PagedAttention, PagedKVCache
from ..models import CausalLM
from ..sampler import sample
from .cuda_graphs import DecodeGraphRunner
from .scheduler import ScheduledRequest


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        cache: PagedKVCache,
        block_manager: BlockManager,
        attention_backend: AttentionBackend | None = None,  # None: the torch reference
        decode_graphs: DecodeGraphRunner | None = None,  # None: every step runs eagerly
    ):
        self.model = model
        self.cache = cache
        self.block_manager = block_manager
        self.attention_backend = attention_backend
        self.decode_graphs = decode_graphs

    def prepare(self, scheduled: list[ScheduledRequest]) -> tuple[torch.Tensor, torch.Tensor, PagedAttentionMetadata]:
        """Build (input_ids (N,), positions (N,), metadata) for the flattened step."""
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        query_start_loc = [0]
        context_lens: list[int] = []
        block_tables: list[list[int]] = []
        for s in scheduled:
            r = s.request
            start, end = r.num_computed_tokens, r.num_computed_tokens + s.num_new_tokens
            input_ids += r.all_token_ids[start:end]
            positions += range(start, end)
            slot_mapping += self.block_manager.slot_mapping(r.request_id, start, end)
            query_start_loc.append(len(input_ids))
            context_lens.append(end)
            block_tables.append(self.block_manager.get_block_table(r.request_id))
        width = max(len(t) for t in block_tables)
        device = self.model.device

        def as_tensor(values) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        meta = PagedAttentionMetadata(
            slot_mapping=as_tensor(slot_mapping),
            query_start_loc=as_tensor(query_start_loc),
            context_lens=as_tensor(context_lens),
            # Through numpy: a list of lists converts to an array ~4x faster than to a tensor,
            # and at 256 sequences of long contexts this table is most of what a step copies.
            block_tables=torch.from_numpy(
                np.array([t + [0] * (width - len(t)) for t in block_tables], dtype=np.int64)
            ).to(device),
            max_query_len=max(s.num_new_tokens for s in scheduled),
        )
        return as_tensor(input_ids), as_tensor(positions), meta

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledRequest]) -> list[int | None]:
        # Triton launches, and graph replays, go to the *current* CUDA device: make it the
        # model's (it may be cuda:1).
        device = self.model.device
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            return self._execute(scheduled)

    def _execute(self, scheduled: list[ScheduledRequest]) -> list[int | None]:
        input_ids, positions, meta = self.prepare(scheduled)
        graphs = self.decode_graphs
        if graphs is not None and graphs.can_run(len(input_ids), meta):
            hidden = graphs.run(input_ids, positions, meta)  # (N, hidden), N == num_seqs
        else:
            attn = PagedAttention(self.cache, meta, self.attention_backend)
            hidden = self.model(input_ids[None], positions[None], attn)[0]  # (N, hidden)
        # Only sequences whose every known token is now computed get a next token.
        sampling = [i for i, s in enumerate(scheduled) if s.completes_sequence]
        results: list[int | None] = [None] * len(scheduled)
        if not sampling:
            return results
        last_token_rows = meta.query_start_loc[1:][sampling] - 1
        logits = self.model.compute_logits(hidden[last_token_rows])  # (num_sampling, V)
        requests = [scheduled[i].request for i in sampling]
        tokens = sample(logits, [r.sampling_params for r in requests], [r.generator for r in requests])
        for i, token in zip(sampling, tokens.tolist()):
            results[i] = token
        return results
