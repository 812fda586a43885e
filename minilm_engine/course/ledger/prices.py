"""The prices a ledger needs: what the machine costs, and what customers pay per token.

Contract: `Prices` is checked once, when built (a clear `ValueError` naming the field), and holds
numbers in one currency of the user's choice ("$", "¥", "EUR" ...), every token price per
million tokens.  Nothing here measures anything.

    gpu_cost_per_hour       rent of ONE accelerator (or one CPU machine) per hour
    utilization             share of the paid hours that serve traffic at the measured rate
                            (nights, spikes and headroom leave the rest idle, still paid)
    input_price_per_mtok    what a customer pays per million prompt tokens
    output_price_per_mtok   ... per million generated tokens (usually several times more:
                            decode costs more per token than prefill, chapter 04)
    cached_input_discount   share taken off the input price for prompt tokens served from the
                            prefix cache (chapter 03), e.g. 0.9 = cached tokens cost 10%
    batch_discount          share taken off both prices in the batch tier: results within
                            hours instead of seconds, so the provider can run large batches
                            (chapter 07), e.g. 0.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HOURS_PER_MONTH = 730  # 365 * 24 / 12, the convention cloud price lists use


def _check_number(name: str, value: object, low: float, high: float | None = None,
                  low_inclusive: bool = False, high_inclusive: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < low or (value == low and not low_inclusive):
        raise ValueError(f"{name} must be {'>=' if low_inclusive else '>'} {low}, got {value!r}")
    if high is not None and (value > high or (value == high and not high_inclusive)):
        raise ValueError(f"{name} must be {'<=' if high_inclusive else '<'} {high}, got {value!r}")


@dataclass(frozen=True)
class Prices:
    gpu_cost_per_hour: float
    currency: str = "$"
    utilization: float = 1.0
    input_price_per_mtok: float | None = None
    output_price_per_mtok: float | None = None
    cached_input_discount: float = 0.0
    batch_discount: float = 0.0

    def __post_init__(self) -> None:
        _check_number("gpu_cost_per_hour", self.gpu_cost_per_hour, 0)
        _check_number("utilization", self.utilization, 0, 1)
        for name in ("input_price_per_mtok", "output_price_per_mtok"):
            if getattr(self, name) is not None:
                _check_number(name, getattr(self, name), 0, low_inclusive=True)
        _check_number("cached_input_discount", self.cached_input_discount, 0, 1, low_inclusive=True)
        _check_number("batch_discount", self.batch_discount, 0, 1, low_inclusive=True,
                      high_inclusive=False)
        if not isinstance(self.currency, str):
            raise ValueError(f"currency must be a string, got {self.currency!r}")

    @property
    def has_token_prices(self) -> bool:
        return self.input_price_per_mtok is not None and self.output_price_per_mtok is not None

    def money(self, amount: float, digits: int = 2) -> str:
        """`amount` written with the currency: "$1.25", "¥30.00", "1.25 EUR"."""
        text = f"{amount:,.{digits}f}"
        return f"{self.currency}{text}" if len(self.currency) <= 1 else f"{text} {self.currency}"
