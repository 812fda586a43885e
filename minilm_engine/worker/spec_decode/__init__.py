"""Speculative decoding: a draft (proposer.py, ngram_proposer.py) guesses, the target checks in
one pass, rejection_sampler.py keeps the output exactly the target's."""

from minilm_engine.core.speculative_config import SpeculativeConfig
from minilm_engine.core.spec_decode_stats import SpecDecodingStats, expected_tokens_per_round

__all__ = ["SpeculativeConfig", "SpecDecodingStats", "expected_tokens_per_round"]
