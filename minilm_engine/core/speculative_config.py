"""`speculative_config={"model": DRAFT, "num_speculative_tokens": K}`, as vLLM spells it.

Contract: `SpeculativeConfig.parse(value)` turns what a user passed (None, a dict, or a
`SpeculativeConfig`) into a valid `SpeculativeConfig`, or None when speculation is off (no
config, or K = 0), and raises `ValueError` / `TypeError` naming the problem otherwise.  It
only checks the dict; whether the draft fits the target (same vocabulary and tokenizer, enough
context, its size) is checked when the draft is loaded (`check_draft_fits_target`), because
that needs both models.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

MAX_SPECULATIVE_TOKENS = 16  # beyond this the chance that all K are accepted is negligible
METHODS = ("draft_model", "ngram")


@dataclass(frozen=True)
class SpeculativeConfig:
    # The draft model: a folder, a hub id, or a shipped name ("noodle-apprentice"); None with
    # method="ngram", which drafts by prompt lookup (`ngram_proposer.py`) and needs no model.
    model: str | None
    num_speculative_tokens: int  # K: tokens proposed per round, >= 1
    method: str = "draft_model"
    prompt_lookup_min: int = 1  # ngram: shortest suffix to look up
    prompt_lookup_max: int = 4  # ngram: longest suffix to look up

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative_config['method'] must be one of {METHODS}, got {self.method!r}")
        if self.method == "draft_model" and self.model is None:
            raise ValueError("speculative_config needs a 'model': the draft's folder, hub id or "
                             "shipped name (or 'method': 'ngram' to draft from the prompt)")
        if self.method == "draft_model" and (not isinstance(self.model, (str, Path)) or not str(self.model)):
            raise TypeError(
                f"speculative_config['model'] must be a folder, a hub id or a shipped model name, "
                f"got {self.model!r}"
            )
        if self.method == "ngram" and self.model is not None:
            raise ValueError("method 'ngram' drafts from the request's own tokens: leave out 'model'")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"num_speculative_tokens must be an int, got {k!r}")
        if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}] "
                f"(0 or None turns speculation off), got {k}"
            )
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (low, high)) or not 1 <= low <= high:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {low} and {high}")

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict[str, Any] | None) -> SpeculativeConfig | None:
        """None, a dict or a SpeculativeConfig -> a SpeculativeConfig, or None for "off"."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise TypeError(
                "speculative_config must be a dict like {'model': 'noodle-apprentice', "
                f"'num_speculative_tokens': 3}}, got {value!r}"
            )
        known = sorted(f.name for f in fields(cls))
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise TypeError(f"unknown speculative_config keys {unknown}; the keys are {known}")
        k = value.get("num_speculative_tokens")
        if k is None or k == 0 and not isinstance(k, bool):
            return None  # vLLM's convention: no speculative tokens, no speculation
        model = value.get("model")
        return cls(**{**value, "model": None if model is None else str(model)})


def check_draft_fits_target(
    draft_config, target_config, draft_tokenizer, target_tokenizer, max_model_len: int,
    draft_num_parameters: int, target_num_parameters: int,
) -> None:
    """Raise ValueError if the draft cannot propose tokens for this target (the rejection sampler
    compares probabilities id by id: the ids must mean the same strings); warn if it is bigger."""
    if draft_config.vocab_size != target_config.vocab_size:
        raise ValueError(
            f"the draft's vocabulary has {draft_config.vocab_size} tokens, the target's "
            f"{target_config.vocab_size}: speculative decoding needs a draft with the target's tokenizer"
        )
    if draft_tokenizer is not None and draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        differ = sorted(set(draft_tokenizer.get_vocab().items()) ^ set(target_tokenizer.get_vocab().items()))
        raise ValueError(
            "the draft's tokenizer differs from the target's (e.g. "
            f"{[piece for piece, _ in differ[:3]]} map to other ids): token ids would mean "
            "different text; use a draft trained with the target's tokenizer"
        )
    if draft_config.max_position_embeddings < max_model_len:
        raise ValueError(
            f"the draft's context holds {draft_config.max_position_embeddings} tokens, less than "
            f"max_model_len={max_model_len}; lower max_model_len or pick a longer-context draft"
        )
    if draft_num_parameters > target_num_parameters:
        warnings.warn(
            f"the draft model ({draft_num_parameters:,} parameters) is bigger than the target "
            f"({target_num_parameters:,}): a round then costs more than it saves",
            stacklevel=3,
        )
