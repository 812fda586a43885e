"""One request at a time, with a contiguous KV cache: prefill once, then one token per step.

The prompt's keys and values are computed once (prefill); each later step feeds only the newest
token and attends to everything cached (decode).  The cache reserves room for the prompt plus
the most tokens the request may produce.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from minilm_engine.course.baselines.contiguous_cache import ContiguousKVCache
from minilm_engine.core.request import Request
from minilm_engine.course.baselines.base import Strategy


class KVCacheStrategy(Strategy):
    name = "kv_cache"

    @torch.inference_mode()
    def steps(self, requests: list[Request]) -> Iterator[list[Request]]:
        device = self.model.device
        for request in requests:
            self.mark_running([request])
            cache = ContiguousKVCache(
                self.model.config,
                batch_size=1,
                max_len=request.num_prompt_tokens + request.max_new_tokens,
                dtype=self.model.dtype,
                device=device,
            )
            ids = torch.tensor(request.prompt_token_ids, device=device)  # prefill: (P,)
            positions = torch.arange(len(ids), device=device)
            while not request.finished:
                cache.begin_step(torch.ones(1, len(ids), dtype=torch.bool, device=device))
                hidden = self.model(ids, positions, cache)  # (T, hidden)
                self.sample_and_append([request], self.model.compute_logits(hidden[-1:]))
                yield [request]
                # decode: only the newest token goes in; its position is the sequence length - 1
                ids = torch.tensor([request.output_token_ids[-1]], device=device)  # (1,)
                positions = torch.tensor([request.num_tokens - 1], device=device)
