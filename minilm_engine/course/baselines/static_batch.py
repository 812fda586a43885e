"""Static batching: pad up to `max_num_seqs` requests into one batch and run it to the end.

    step:      0(prefill) 1    2    3    4    5
    request A: [pppppppp][a1] [a2] [a3] [EOS] ....  <- finished, but its row keeps running
    request B: [..pppppp][b1] [b2] [b3] [b4] [b5]   <- the batch ends when B ends

Nobody new may join until the longest request of the batch has finished: rows of finished
requests burn compute (and their reserved cache) for nothing.  This is the "round table"
that chapter 01 compares with continuous batching.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from minilm_engine.course.baselines.contiguous_cache import ContiguousKVCache, forward_rows
from minilm_engine.core.request import Request
from minilm_engine.course.baselines.base import Strategy


class StaticBatchStrategy(Strategy):
    name = "static_batch"

    @torch.inference_mode()
    def steps(self, requests: list[Request]) -> Iterator[list[Request]]:
        for start in range(0, len(requests), self.config.max_num_seqs):
            yield from self._run_batch(requests[start : start + self.config.max_num_seqs])

    def _run_batch(self, batch: list[Request]) -> Iterator[list[Request]]:
        device = self.model.device
        pad_id = 0  # any id works: padding is masked out of attention
        B = len(batch)
        P = max(r.num_prompt_tokens for r in batch)
        # 1. Left-pad the prompts so every row's next token lands in the same column.
        ids = torch.full((B, P), pad_id, dtype=torch.long, device=device)
        valid = torch.zeros(B, P, dtype=torch.bool, device=device)
        for row, r in enumerate(batch):
            ids[row, P - r.num_prompt_tokens :] = torch.tensor(r.prompt_token_ids)
            valid[row, P - r.num_prompt_tokens :] = True
        positions = (valid.cumsum(dim=1) - 1).clamp(min=0)  # real tokens count from 0
        # 2. Every row reserves room for the longest possible request of the batch.
        cache = ContiguousKVCache(
            self.model.config,
            batch_size=B,
            max_len=P + max(r.max_new_tokens for r in batch),
            dtype=self.model.dtype,
            device=device,
        )
        self.mark_running(batch)
        while True:
            cache.begin_step(valid)
            hidden = forward_rows(self.model, ids, positions, cache)  # (B, T, hidden)
            logits = self.model.compute_logits(hidden[:, -1])  # (B, V)
            active = [row for row, r in enumerate(batch) if not r.finished]
            self.sample_and_append([batch[row] for row in active], logits[active])
            yield [batch[row] for row in active]
            if all(r.finished for r in batch):
                return
            # 3. Next step: one token per row; finished rows feed padding but still take a slot.
            ids = torch.full((B, 1), pad_id, dtype=torch.long, device=device)
            valid = torch.zeros(B, 1, dtype=torch.bool, device=device)
            positions = torch.zeros(B, 1, dtype=torch.long, device=device)
            for row, r in enumerate(batch):
                if not r.finished:
                    ids[row, 0] = r.output_token_ids[-1]
                    valid[row, 0] = True
                    positions[row, 0] = r.num_tokens - 1
