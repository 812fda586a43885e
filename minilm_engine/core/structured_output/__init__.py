"""Structured outputs (vLLM's name): a grammar per request that decides which tokens may come next.

Contract: the engine's input processor asks `StructuredOutputManager.new_grammar(params)` for
each request whose `SamplingParams.structured_outputs` is set and keeps the `Grammar` on the
request.  Data then flows one way through each step:

    request.grammar ──> sampler: fill the bitmask of the grammar rows, -inf where a bit is 0
          ▲             (`worker/structured_output.py`), then sample as usual
          └── Request appends the sampled token: grammar.accept_token(t); terminated -> stop

The backend (xgrammar, and its vocabulary view) is built on the first constrained request, so
an engine that never sees one never imports xgrammar.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minilm_engine.core.structured_output.backend_xgrammar import Grammar, XgrammarBackend
from minilm_engine.core.structured_output.grammar_spec import GrammarSpec

if TYPE_CHECKING:
    from minilm_engine.core.sampling_params import SamplingParams

__all__ = ["Grammar", "GrammarSpec", "StructuredOutputManager", "XgrammarBackend"]


class StructuredOutputManager:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self.backend: XgrammarBackend | None = None  # built on first use

    def new_grammar(self, params: SamplingParams) -> Grammar | None:
        """A fresh matcher for a request with these params (None: no structured output)."""
        if params.structured_outputs is None:
            return None
        if self.backend is None:
            if self.tokenizer is None:
                raise ValueError("structured_outputs needs the model's tokenizer, and this engine has none")
            self.backend = XgrammarBackend(self.tokenizer, self.vocab_size, self.stop_token_ids)
        return self.backend.new_grammar(GrammarSpec.of(params.structured_outputs))
