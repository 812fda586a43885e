"""Speculative decoding: a small draft model guesses, the target model checks in one pass.

    config.py             `SpeculativeConfig` (vLLM's `speculative_config` dict), checked once
    proposer.py           `DraftModelProposer`: the draft model, its own paged KV cache and blocks
    ngram_proposer.py     `NgramProposer`: drafts copied from the request's own tokens (no model)
    rejection_sampler.py  accept or reject the drafted tokens so the output stays exactly the target's
    metrics.py            `SpecDecodingStats` (num_drafts, num_draft_tokens, num_accepted_tokens)
                          and the expected tokens per round, (1 - a^(K+1)) / (1 - a)

The engine (`entrypoints/llm_engine.py`) calls them; nothing here decides who runs when.
"""

from minilm_engine.core.speculative_config import SpeculativeConfig
from minilm_engine.core.spec_decode_stats import SpecDecodingStats, expected_tokens_per_round

__all__ = ["SpeculativeConfig", "SpecDecodingStats", "expected_tokens_per_round"]
