"""How to pick each next token, per request: the same fields and defaults as vLLM's SamplingParams.

Contract: a `SamplingParams` that constructs is valid; anything else raises `ValueError` or
`TypeError` saying what is allowed.  `temperature=0` means greedy (argmax), and then top-p,
top-k, min-p and seed do not matter.  The ranges are vLLM's:

    n >= 1                      independent samples of one prompt (the engine caps it: max_n)
    presence_penalty, frequency_penalty in [-2, 2]      (OpenAI's, over the output tokens)
    repetition_penalty > 0      1 = off (over prompt and output tokens, as transformers')
    min_p in [0, 1]             min_tokens >= 0 (and <= max_tokens)
    logprobs, prompt_logprobs   None or >= 0 top tokens (the engine caps them: max_logprobs, 20)
    logit_bias                  {token id: bias}, biases in [-100, 100] (OpenAI's range)
    structured_outputs          None or a `StructuredOutputsParams` with exactly one of json,
                                json_object, regex, choice, grammar (checked by the grammar
                                library at construction: `core/structured_output/`)
"""

from __future__ import annotations

import json as _json  # `json` is a field of StructuredOutputsParams
import math
from dataclasses import dataclass, field, replace


@dataclass
class StructuredOutputsParams:
    """vLLM's: the output must follow one grammar.  Exactly one of the five is set:

        json         a JSON schema (a dict, or its JSON text) the output validates against
        json_object  True: any JSON object
        regex        a regular expression the whole output matches
        choice       the output is exactly one of these strings
        grammar      an EBNF grammar in xgrammar's dialect (`root ::= "a" | "b"`)

    `disable_any_whitespace` (JSON only): no whitespace between JSON tokens, where vLLM's default
    allows any (a small model may otherwise fill its tokens with spaces)."""

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
            raise TypeError(f"structured_outputs.json must be a JSON schema (a dict or its JSON text), got {self.json!r}")
        if isinstance(self.json, str):
            try:
                _json.loads(self.json)
            except ValueError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
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
                raise TypeError(f"structured_outputs.choice must be a non-empty list of strings, got {self.choice!r}")
            self.choice = list(self.choice)
        if not isinstance(self.disable_any_whitespace, bool):
            raise TypeError(f"structured_outputs.disable_any_whitespace must be a bool, got {self.disable_any_whitespace!r}")
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
    # filled in by __post_init__: stop strings as a list
    _stop_list: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature)
        if not self.temperature >= 0:  # written this way so that NaN is rejected too
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        _check_number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k)
        if self.top_k == -1:
            self.top_k = 0
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 or -1 (disabled) or a positive int, got {self.top_k}")
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens)
            if self.max_tokens < 1:
                raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens}")
        if self.seed is not None:
            _check_int("seed", self.seed)
        if self.stop is None:
            self._stop_list = []
        elif isinstance(self.stop, str):
            self._stop_list = [self.stop]
        elif isinstance(self.stop, (list, tuple)) and all(isinstance(s, str) for s in self.stop):
            self._stop_list = list(self.stop)
        else:
            raise TypeError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if any(s == "" for s in self._stop_list):
            raise ValueError("stop strings must not be empty")
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if not isinstance(self.stop_token_ids, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
        ):
            raise TypeError(
                f"stop_token_ids must be a list of non-negative ints, got {self.stop_token_ids!r}"
            )
        self.stop_token_ids = list(self.stop_token_ids)
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        self._check_extensions()

    def _check_extensions(self) -> None:
        """The fields beyond temperature / top-p / top-k, in vLLM's ranges."""
        _check_int("n", self.n)
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_number(name, value)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        _check_number("repetition_penalty", self.repetition_penalty)
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        _check_number("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        _check_int("min_tokens", self.min_tokens)
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}"
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value)
                if value < 0:
                    raise ValueError(f"{name} must be None or >= 0 (top tokens per position), got {value}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise TypeError(f"logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}")
            for token, bias in self.logit_bias.items():
                if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                    raise TypeError(f"logit_bias keys must be non-negative token ids, got {token!r}")
                _check_number(f"logit_bias[{token}]", bias)
                if not -100.0 <= bias <= 100.0:
                    raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for token {token}")
            self.logit_bias = dict(self.logit_bias)
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise TypeError(f"structured_outputs must be a StructuredOutputsParams, got {self.structured_outputs!r}")

    @property
    def needs_processing(self) -> bool:
        """Whether any logits processor (penalties, bias, min-tokens) changes this row's logits."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
            or bool(self.logit_bias)
            or self.min_tokens > 0
        )

    def for_sample(self, index: int) -> SamplingParams:
        """The params of sample `index` of an n > 1 request: n = 1, and a seed of seed + index
        (vLLM's rule), so sample i of a seeded request is reproducible on its own.  Prompt
        logprobs are asked of sample 0 only: the others then read the prompt's KV from the
        prefix cache (a request that wants prompt logprobs must compute every prompt position)."""
        return replace(
            self,
            n=1,
            seed=None if self.seed is None else self.seed + index,
            prompt_logprobs=self.prompt_logprobs if index == 0 else None,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def stop_strings(self) -> list[str]:
        return self._stop_list


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")


def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
