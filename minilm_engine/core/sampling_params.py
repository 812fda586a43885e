"""How to pick each next token, per request: the same fields and defaults as vLLM's SamplingParams.

Contract: a `SamplingParams` that constructs is valid (vLLM's ranges, one `_check` per field
in `__post_init__`); anything else raises `ValueError` or `TypeError` saying what is allowed.
`temperature=0` means greedy (argmax), and then top-p, top-k, min-p and seed do not matter.
The engine caps `n` (max_n) and the logprobs (max_logprobs); presence and frequency penalties
are OpenAI's (over the output tokens), the repetition penalty transformers' (prompt and output).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass
class StructuredOutputsParams:
    """vLLM's: the output must follow one grammar.  Exactly one of the five is set:

        json         a JSON schema (a dict, or its JSON text) the output validates against
        json_object  True: any JSON object
        regex        a regular expression the whole output matches
        choice       the output is exactly one of these strings
        grammar      an EBNF grammar in xgrammar's dialect (`root ::= "a" | "b"`)

    `disable_any_whitespace` (JSON only): no whitespace between JSON tokens (vLLM allows any)."""

    json: dict | str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        given = [name for name in _GRAMMAR_FIELDS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs needs exactly one of {', '.join(_GRAMMAR_FIELDS)}, "
                             f"got {', '.join(given) if given else 'none'}")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise TypeError(f"structured_outputs.json must be a JSON schema (a dict or its JSON "
                            f"text), got {self.json!r}")
        if self.json_object not in (None, True, False):
            raise TypeError(f"structured_outputs.json_object must be true, got {self.json_object!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not self.choice or not all(
                isinstance(c, str) for c in self.choice
            ):
                raise TypeError(f"structured_outputs.choice must be a non-empty list of strings, "
                                f"got {self.choice!r}")
            self.choice = list(self.choice)
        _check("structured_outputs.disable_any_whitespace", self.disable_any_whitespace, bool)
        # Last: can the grammar library follow it? (ValueError naming the field if not.)
        from minilm_engine.core.structured_output.grammar_spec import GrammarSpec, to_xgrammar

        to_xgrammar(GrammarSpec.of(self))


_GRAMMAR_FIELDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1, vLLM's older spelling) = consider every token
    max_tokens: int | None = 16  # None = until the model's context is full
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0  # EOS and stop tokens are masked until this many outputs exist
    logit_bias: dict[int, float] | None = None
    # Logprobs of the raw model (log-softmax of the logits before any penalty or temperature,
    # vLLM V1's default "raw_logprobs"): of each sampled token plus the top `logprobs` ones,
    # and of each prompt token (the first has none) plus the top `prompt_logprobs` ones.
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None  # None: any tokens
    _stop_list: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        # (Each test is written so that NaN fails it.)
        _check("temperature", self.temperature, float, lambda v: v >= 0, ">= 0 (0 = greedy)")
        _check("top_p", self.top_p, float, lambda v: 0 < v <= 1, "in (0, 1]")
        _check("top_k", self.top_k, int, lambda v: v >= -1, "0 or -1 (disabled) or a positive int")
        self.top_k = max(self.top_k, 0)
        if self.max_tokens is not None:
            _check("max_tokens", self.max_tokens, int, lambda v: v >= 1, ">= 1 or None")
        if self.seed is not None:
            _check("seed", self.seed, int)
        if self.stop is None or isinstance(self.stop, str):
            self._stop_list = [] if self.stop is None else [self.stop]
        elif isinstance(self.stop, (list, tuple)) and all(isinstance(s, str) for s in self.stop):
            self._stop_list = list(self.stop)
        else:
            raise TypeError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if "" in self._stop_list:
            raise ValueError("stop strings must not be empty")
        self.stop_token_ids = [] if self.stop_token_ids is None else self.stop_token_ids
        if not isinstance(self.stop_token_ids, (list, tuple)) or not all(
            _is_int(t) and t >= 0 for t in self.stop_token_ids
        ):
            raise TypeError(f"stop_token_ids must be a list of non-negative ints, "
                            f"got {self.stop_token_ids!r}")
        self.stop_token_ids = list(self.stop_token_ids)
        _check("ignore_eos", self.ignore_eos, bool)
        _check("include_stop_str_in_output", self.include_stop_str_in_output, bool)
        _check("n", self.n, int, lambda v: v >= 1, ">= 1")
        for name in ("presence_penalty", "frequency_penalty"):
            _check(name, getattr(self, name), float, lambda v: -2 <= v <= 2, "in [-2, 2]")
        _check("repetition_penalty", self.repetition_penalty, float, lambda v: 0 < v < math.inf,
               "> 0 (1 = off)")
        _check("min_p", self.min_p, float, lambda v: 0 <= v <= 1, "in [0, 1]")
        _check("min_tokens", self.min_tokens, int, lambda v: v >= 0, ">= 0")
        if self.max_tokens is not None:
            _check("min_tokens", self.min_tokens, int, lambda v: v <= self.max_tokens,
                   f"<= max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _check(name, getattr(self, name), int, lambda v: v >= 0,
                       "None or >= 0 (top tokens per position)")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise TypeError(f"logit_bias must be a dict of token id -> bias, "
                                f"got {self.logit_bias!r}")
            for token, bias in self.logit_bias.items():
                if not _is_int(token) or token < 0:
                    raise TypeError(f"logit_bias keys must be non-negative token ids, got {token!r}")
                _check("logit_bias values", bias, float, lambda v: abs(v) <= 100, "in [-100, 100]")
            self.logit_bias = dict(self.logit_bias)
        structured = self.structured_outputs
        if structured is not None and not isinstance(structured, StructuredOutputsParams):
            raise TypeError(f"structured_outputs must be a StructuredOutputsParams, "
                            f"got {structured!r}")

    @property
    def needs_processing(self) -> bool:
        """Whether any logits processor (penalties, bias, min-tokens) changes this row's logits."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1
                    or self.logit_bias or self.min_tokens > 0)

    def for_sample(self, index: int) -> SamplingParams:
        """The params of sample `index` of an n > 1 request: n = 1, seed + index (vLLM's rule:
        each sample reproducible on its own), prompt logprobs for sample 0 only (the others
        then read the prompt's KV from the prefix cache)."""
        seed = None if self.seed is None else self.seed + index
        prompt_logprobs = self.prompt_logprobs if index == 0 else None
        return replace(self, n=1, seed=seed, prompt_logprobs=prompt_logprobs)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def stop_strings(self) -> list[str]:
        return self._stop_list


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(name: str, value: object, kind: type, ok: Callable[[Any], bool] = lambda v: True,
           allowed: str = "") -> None:
    """TypeError unless `value` is a `kind` (bool, int, or float: any number but a bool);
    ValueError unless `ok(value)`, saying what is `allowed`."""
    if kind is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    elif not (_is_int(value) or kind is float and isinstance(value, float)):
        raise TypeError(f"{name} must be {'an int' if kind is int else 'a number'}, got {value!r}")
    if not ok(value):
        raise ValueError(f"{name} must be {allowed}, got {value}")
