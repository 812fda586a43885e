"""Structured outputs (vLLM's name): a grammar per request that decides which tokens may come next.

Contract: the engine's input processor asks `StructuredOutputManager.new_grammar(params)` for
each request whose `SamplingParams.structured_outputs` is set and keeps the `Grammar` on the
request.  Data then flows one way through each step:

    request.grammar ──> sampler: fill the bitmask of the grammar rows, -inf where a bit is 0
          ▲             (`worker/structured_output.py`), then sample as usual
          └── Request appends the sampled token: grammar.accept_token(t); terminated -> stop

The backend (xgrammar) is built on the first constrained request: only then is it imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from minilm_engine.core.structured_output.backend_xgrammar import Grammar, XgrammarBackend
from minilm_engine.core.structured_output.grammar_spec import GrammarSpec

if TYPE_CHECKING:
    from minilm_engine.core.sampling_params import SamplingParams

__all__ = ["Grammar", "GrammarSpec", "StructuredOutputManager", "StructuredOutputsConfig", "XgrammarBackend"]


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """The engine's settings (vLLM's `--structured-outputs-config`): the backend (xgrammar only)
    and `disable_any_whitespace` for every request (compact JSON, which a small model needs)."""

    backend: str = "xgrammar"
    disable_any_whitespace: bool = False

    @classmethod
    def parse(cls, value: StructuredOutputsConfig | dict[str, Any] | None) -> StructuredOutputsConfig:
        if value is None or isinstance(value, cls):
            return value or cls()
        if not isinstance(value, dict):
            raise TypeError(f"structured_outputs_config must be a dict, got {value!r}")
        unknown = sorted(set(value) - {"backend", "disable_any_whitespace"})
        if unknown:
            raise ValueError(f"structured_outputs_config: unknown keys {unknown} (known: backend, disable_any_whitespace)")
        config = cls(**value)
        if config.backend not in ("xgrammar", "auto"):
            raise ValueError(f"structured_outputs_config.backend must be \"xgrammar\" (or \"auto\"), got {config.backend!r}")
        if not isinstance(config.disable_any_whitespace, bool):
            raise TypeError(f"structured_outputs_config.disable_any_whitespace must be a bool, "
                            f"got {config.disable_any_whitespace!r}")
        return config


class StructuredOutputManager:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...],
                 config: StructuredOutputsConfig | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self.config = config or StructuredOutputsConfig()
        self.backend: XgrammarBackend | None = None  # built on first use

    def new_grammar(self, params: SamplingParams) -> Grammar | None:
        """A fresh matcher for a request with these params (None: no structured output)."""
        if params.structured_outputs is None:
            return None
        if self.backend is None:
            if self.tokenizer is None:
                raise ValueError("structured_outputs needs the model's tokenizer, and this engine has none")
            self.backend = XgrammarBackend(self.tokenizer, self.vocab_size, self.stop_token_ids)
        return self.backend.new_grammar(GrammarSpec.of(params.structured_outputs, self.config.disable_any_whitespace))
