"""How to pick each next token, per request: the same fields and defaults as vLLM's SamplingParams.

Contract: a `SamplingParams` that constructs is valid; anything else raises `ValueError` or
`TypeError` saying what is allowed.  `temperature=0` means greedy (argmax), and then top-p,
top-k and seed do not matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

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
