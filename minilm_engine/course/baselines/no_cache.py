"""The naive baseline: every new token recomputes the whole sequence from scratch.

Step n processes n tokens, so generating N tokens costs O(N^2) token-passes through the model,
and attention inside each pass adds another O(N^2).  Chapter 02 measures how this loses to the
KV cache as generations grow.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from minilm_engine.course.baselines.contiguous_cache import NoKVCache
from minilm_engine.core.request import Request
from minilm_engine.course.baselines.base import Strategy


class NoCacheStrategy(Strategy):
    name = "no_cache"

    @torch.inference_mode()
    def steps(self, requests: list[Request]) -> Iterator[list[Request]]:
        device = self.model.device
        for request in requests:  # one request at a time
            self.mark_running([request])
            while not request.finished:
                ids = torch.tensor(request.all_token_ids, device=device)  # (T,)
                positions = torch.arange(len(ids), device=device)  # (T,)
                valid = torch.ones(1, len(ids), dtype=torch.bool, device=device)  # one row of T
                hidden = self.model(ids, positions, NoKVCache(valid))  # (T, hidden)
                self.sample_and_append([request], self.model.compute_logits(hidden[-1:]))
                yield [request]
