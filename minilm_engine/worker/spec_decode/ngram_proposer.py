"""Prompt-lookup (n-gram) drafting: the zero-cost draft, no second model.

Contract: `NgramProposer.propose(requests, num_drafts)` has the interface of
`DraftModelProposer`: for each request, up to `num_drafts[i]` tokens.  They are copied from the
request's own tokens: find the most recent earlier place where the last n tokens (n from
`prompt_lookup_max` down to `prompt_lookup_min`) occurred, and propose what followed them there.

    tokens:  ... 1 x Miso Ramen @ $12 ... 1 x Miso Ramen @ ?      last 3 tokens: "x Miso Ramen"
                   └── match ──┘ └ proposed: "@ $12"

No state, no cache.  The drafts are certain (q one-hot), which the rejection sampler handles
exactly.  Strong when the output quotes its input, useless on fresh text.  vLLM's "ngram".
"""

from __future__ import annotations

import torch

from minilm_engine.core.request import Request
from minilm_engine.core.outputs import DraftTokens


def find_ngram_continuation(token_ids: list[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to `num_tokens` tokens that followed the most recent earlier occurrence of the longest
    suffix (max_n down to min_n tokens) of `token_ids`; [] when there is none."""
    for n in range(min(max_n, len(token_ids) - 1), min_n - 1, -1):
        suffix = token_ids[-n:]
        # Latest match first: recent context is the best guess of what comes next.
        for start in range(len(token_ids) - n - 1, -1, -1):
            if token_ids[start : start + n] == suffix:
                return token_ids[start + n : start + n + num_tokens]
    return []


class NgramProposer:
    def __init__(self, vocab_size: int, prompt_lookup_min: int = 1, prompt_lookup_max: int = 4):
        self.vocab_size = vocab_size
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, requests: list[Request], num_drafts: list[int]) -> list[DraftTokens]:
        proposals = []
        for request, k in zip(requests, num_drafts):
            tokens = find_ngram_continuation(
                request.all_token_ids, k, self.prompt_lookup_min, self.prompt_lookup_max
            ) if k > 0 else []
            probs = None
            if tokens and not request.sampling_params.greedy:
                # A certain draft: q is one-hot on each drafted token.
                probs = torch.zeros(len(tokens), self.vocab_size, device=request.generator.device)
                probs[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
            proposals.append(DraftTokens(tokens, probs))
        return proposals

    def rollback(self, request: Request) -> None:
        """Nothing to roll back: no cache."""

    def free(self, request_id: str) -> None:
        """Nothing to free: no blocks."""
