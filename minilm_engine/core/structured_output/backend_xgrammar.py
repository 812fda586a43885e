"""The grammar backend on xgrammar (vLLM's default): compile once per spec, one matcher per request.

Contract: `XgrammarBackend(tokenizer, vocab_size, stop_token_ids)` builds xgrammar's view of
the vocabulary once, sized to the model's `vocab_size` (ids past the tokenizer's are never
allowed).  `compile(spec)` compiles each `GrammarSpec` once (`num_compiled` counts them).
`Grammar` is one request's position in its grammar:

    accept_token(t)       advance by the token the sampler chose (False: not allowed)
    fill_bitmask(bm, row) write row `row` of an int32 bitmask (B, ceil(V / 32)): bit j of word i
                          set <=> token 32 * i + j may come next
    is_terminated         the grammar is complete and a stop token was accepted

A complete grammar allows only the stop tokens (the model's EOS ids), so a constrained request
ends as an EOS would end it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import TYPE_CHECKING

from minilm_engine.core.structured_output.grammar_spec import GrammarSpec, to_xgrammar

if TYPE_CHECKING:
    import torch
    import xgrammar


class Grammar:
    """One request's matcher (xgrammar's `GrammarMatcher`), advanced token by token."""

    def __init__(self, matcher: xgrammar.GrammarMatcher, spec: GrammarSpec, vocab_size: int):
        self.matcher = matcher
        self.spec = spec
        self.vocab_size = vocab_size  # the model's: the bitmask has ceil(vocab_size / 32) words

    def accept_token(self, token_id: int) -> bool:
        return self.matcher.accept_token(token_id)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()


class XgrammarBackend:
    """Invariant: `compiled` holds at most `cache_size` grammars, least recently used first."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...], cache_size: int = 256):
        import xgrammar as xgr

        self.vocab_size = vocab_size
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids))
        self.compiler = xgr.GrammarCompiler(
            self.tokenizer_info, max_threads=min(8, os.cpu_count() or 1), cache_enabled=False)
        self.compiled: OrderedDict[GrammarSpec, xgrammar.CompiledGrammar] = OrderedDict()
        self.cache_size = cache_size
        self.num_compiled = 0

    def compile(self, spec: GrammarSpec) -> xgrammar.CompiledGrammar:
        """The compiled grammar of `spec`, from the cache when it was compiled before."""
        found = self.compiled.get(spec)
        if found is not None:
            self.compiled.move_to_end(spec)
            return found
        found = self.compiler.compile_grammar(to_xgrammar(spec))
        self.num_compiled += 1
        self.compiled[spec] = found
        if len(self.compiled) > self.cache_size:
            self.compiled.popitem(last=False)
        return found

    def new_grammar(self, spec: GrammarSpec) -> Grammar:
        import xgrammar as xgr

        return Grammar(xgr.GrammarMatcher(self.compile(spec)), spec, self.vocab_size)
