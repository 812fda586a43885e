"""The books: a measured run and a price list turned into costs, prices, margins and GPU counts.

Contract: `Ledger(measurement, prices)` computes every figure from those two and nothing else,
and `entries()` lists each with the measurement it came from.  The arithmetic, written once:

    paid seconds of the run       = duration / utilization          (idle hours are paid too)
    cost of the run               = gpu_cost_per_hour * num_gpus * paid seconds / 3600
    blended cost per Mtok output  = cost of the run / output tokens * 1e6
                                  = chapter 00's cost_per_million_tokens(price / utilization, tok/s)

Prompt and generated tokens do not cost the same (a prompt token is one of hundreds computed
together in a prefill, a generated token pays for a whole decode step, chapter 04).  With `w`
the cost of one computed prompt token in generated tokens (measured by `fit_token_seconds`, or
given), a cached prompt token costing nothing to compute:

    cost per output token  c = cost of the run / (output + w * (input - cached))
    cost per input token       w * c

Revenue uses the customer prices: cached prompt tokens at (1 - cached_input_discount) of the
input price, everything at (1 - batch_discount) in the batch tier.  Break-even is the price
list scaled so that revenue equals cost; margin = (revenue - cost) / revenue.

Capacity: `throughput_at_slo(sweep, slo)` picks the best throughput among a load sweep's points
that meet the latency objective (chapter 07); `gpus_needed` and `monthly_cost` size a fleet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from minilm_engine.course.experiments.cost import (
    SECONDS_PER_HOUR,
    TOKENS_PER_MILLION,
    cost_per_million_tokens,
)
from minilm_engine.course.ledger.measurement import Measurement, Provenance
from minilm_engine.course.ledger.prices import HOURS_PER_MONTH, Prices


@dataclass(frozen=True)
class LedgerEntry:
    """One figure of the books, with how it was computed and what it was measured on."""

    label: str
    value: float
    unit: str
    formula: str
    provenance: Provenance


@dataclass(frozen=True)
class SLO:
    """A latency objective on percentiles (None = no limit on that metric)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    percentile: int = 99

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0):
                raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")

    def met_by(self, m: Measurement) -> bool:
        """True when `m` has the percentiles the SLO limits and they are within the limits."""
        for limit, values in ((self.ttft_s, m.ttft_s), (self.tpot_s, m.tpot_s)):
            if limit is None:
                continue
            if self.percentile not in values:
                raise ValueError(
                    f"the measurement has no p{self.percentile} (it has {sorted(values)}): "
                    f"{m.provenance.describe()}"
                )
            if values[self.percentile] > limit:
                return False
        return True

    def describe(self) -> str:
        parts = [f"p{self.percentile} {name} <= {1e3 * v:g} ms"
                 for name, v in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s)) if v is not None]
        return " and ".join(parts) or "no latency limit"


class Ledger:
    """The books of one measured run at one price list.

    `input_token_weight`: the cost of one computed prompt token in generated tokens; None takes
    the measurement's own (fitted from the engine's trace); the input/output split is
    unavailable (a clear error) when neither exists.
    """

    def __init__(
        self, measurement: Measurement, prices: Prices, input_token_weight: float | None = None
    ):
        if not isinstance(measurement, Measurement):
            raise TypeError(f"measurement must be a Measurement, got {type(measurement).__name__}")
        if not isinstance(prices, Prices):
            raise TypeError(f"prices must be a Prices, got {type(prices).__name__}")
        if measurement.num_output_tokens == 0:
            raise ValueError("the measurement produced no output tokens: nothing to put a cost on")
        weight = measurement.input_token_weight if input_token_weight is None else input_token_weight
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))
                                   or not math.isfinite(weight) or weight < 0):
            raise ValueError(f"input_token_weight must be a number >= 0, got {weight!r}")
        self.measurement = measurement
        self.prices = prices
        self.input_token_weight = weight

    # -- cost ------------------------------------------------------------------------------------

    @property
    def paid_seconds(self) -> float:
        return self.measurement.duration_s / self.prices.utilization

    @property
    def run_cost(self) -> float:
        """What the machine time of the run cost, idle share included."""
        m, p = self.measurement, self.prices
        return p.gpu_cost_per_hour * m.num_gpus * self.paid_seconds / SECONDS_PER_HOUR

    @property
    def blended_cost_per_mtok(self) -> float:
        """Everything charged to the output tokens: chapter 00's cost per million tokens."""
        m, p = self.measurement, self.prices
        price = p.gpu_cost_per_hour * m.num_gpus / p.utilization
        return cost_per_million_tokens(price, m.output_tokens_per_s)

    def _require_weight(self) -> float:
        if self.input_token_weight is None:
            raise ValueError(
                "input and output tokens cannot be costed apart: the measurement has no split "
                "of step time (pass trace_records to Measurement.from_outputs, or give "
                "input_token_weight, e.g. 0.05 if a prompt token costs 1/20 of an output token)"
            )
        return self.input_token_weight

    @property
    def output_cost_per_mtok(self) -> float:
        m, w = self.measurement, self._require_weight()
        computed_input = m.num_input_tokens - m.num_cached_input_tokens
        return self.run_cost / (m.num_output_tokens + w * computed_input) * TOKENS_PER_MILLION

    @property
    def input_cost_per_mtok(self) -> float:
        """Per million prompt tokens that are computed (a cached one costs no compute)."""
        return self._require_weight() * self.output_cost_per_mtok

    # -- revenue ---------------------------------------------------------------------------------

    def revenue(self, batch_tier: bool = False) -> float:
        """What customers paid for the run's tokens at the price list."""
        m, p = self.measurement, self.prices
        if not p.has_token_prices:
            raise ValueError("the prices have no input_price_per_mtok / output_price_per_mtok")
        uncached = m.num_input_tokens - m.num_cached_input_tokens
        input_paid = (uncached + m.num_cached_input_tokens * (1 - p.cached_input_discount)) \
            * p.input_price_per_mtok
        total = (input_paid + m.num_output_tokens * p.output_price_per_mtok) / TOKENS_PER_MILLION
        return total * (1 - p.batch_discount) if batch_tier else total

    def margin(self, batch_tier: bool = False) -> float:
        """(revenue - cost) / revenue: the share of each unit of revenue that is profit."""
        revenue = self.revenue(batch_tier)
        if revenue <= 0:
            raise ValueError("revenue is zero: a margin needs positive prices")
        return (revenue - self.run_cost) / revenue

    def break_even_scale(self, batch_tier: bool = False) -> float:
        """The factor by which the price list must be multiplied for revenue to equal cost
        (< 1: there is room to cut prices; > 1: every token loses money)."""
        revenue = self.revenue(batch_tier)
        if revenue <= 0:
            raise ValueError("revenue is zero: break-even needs positive prices")
        return self.run_cost / revenue

    def break_even_prices(self, batch_tier: bool = False) -> tuple[float, float]:
        """(input, output) price per Mtok at which this run neither earns nor loses, keeping
        the price list's input/output ratio (and the tier's discount, if batch_tier)."""
        k = self.break_even_scale(batch_tier)
        return k * self.prices.input_price_per_mtok, k * self.prices.output_price_per_mtok

    def break_even_output_price(self) -> float:
        """The output price per Mtok at which the run breaks even with the input price as is."""
        m, p = self.measurement, self.prices
        if p.input_price_per_mtok is None:
            raise ValueError("the prices have no input_price_per_mtok")
        uncached = m.num_input_tokens - m.num_cached_input_tokens
        input_revenue = (uncached + m.num_cached_input_tokens * (1 - p.cached_input_discount)) \
            * p.input_price_per_mtok / TOKENS_PER_MILLION
        return (self.run_cost - input_revenue) / m.num_output_tokens * TOKENS_PER_MILLION

    # -- the whole page ------------------------------------------------------------------------

    def entries(self) -> list[LedgerEntry]:
        """Every figure this ledger can compute with what it has, each with its provenance."""
        p, cur, prov = self.prices, self.prices.currency, self.measurement.provenance
        per = f"{cur}/Mtok"
        rows = [
            LedgerEntry("output tokens/s", self.measurement.output_tokens_per_s, "tokens/s",
                        "output tokens / duration", prov),
            LedgerEntry("cost of the run", self.run_cost, cur,
                        "gpu_cost_per_hour * num_gpus * duration / utilization / 3600", prov),
            LedgerEntry("blended cost per Mtok output", self.blended_cost_per_mtok, per,
                        "cost of the run / output tokens * 1e6", prov),
        ]
        if self.input_token_weight is not None:
            rows += [
                LedgerEntry("cost per Mtok output", self.output_cost_per_mtok, per,
                            "cost / (output + w * computed input) * 1e6", prov),
                LedgerEntry("cost per Mtok input (computed)", self.input_cost_per_mtok, per,
                            f"w * output cost, w = {self.input_token_weight:.3g}", prov),
            ]
        if p.has_token_prices:
            b_in, b_out = self.break_even_prices()
            rows += [
                LedgerEntry("revenue of the run", self.revenue(), cur,
                            "tokens * prices (cached input discounted)", prov),
                LedgerEntry("margin", self.margin(), "share of revenue",
                            "(revenue - cost) / revenue", prov),
                LedgerEntry("break-even input price", b_in, per, "price list * cost / revenue", prov),
                LedgerEntry("break-even output price", b_out, per, "price list * cost / revenue", prov),
            ]
            if p.batch_discount:
                rows.append(LedgerEntry("margin, batch tier", self.margin(batch_tier=True),
                                        "share of revenue", "prices * (1 - batch_discount)", prov))
        return rows

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame(
            [{"figure": e.label, "value": e.value, "unit": e.unit, "how": e.formula,
              "measured": e.provenance.describe()} for e in self.entries()]
        )


# -- capacity --------------------------------------------------------------------------------


def throughput_at_slo(sweep: Sequence[Measurement], slo: SLO) -> Measurement:
    """The point of a load sweep with the most output tokens/s among those that meet `slo`."""
    if not sweep:
        raise ValueError("the sweep has no measurements")
    meeting = [m for m in sweep if slo.met_by(m)]
    if not meeting:
        raise ValueError(f"no point of the sweep meets the SLO ({slo.describe()})")
    return max(meeting, key=lambda m: m.output_tokens_per_s / m.num_gpus)


def gpus_needed(target_output_tokens_per_s: float, per_gpu_tokens_per_s: float) -> int:
    """Accelerators needed to sustain a target load, each delivering `per_gpu_tokens_per_s`
    (measured at the SLO): a fraction of a GPU cannot be rented, so round up."""
    for name, value in (("target_output_tokens_per_s", target_output_tokens_per_s),
                        ("per_gpu_tokens_per_s", per_gpu_tokens_per_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                or math.isinf(value):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return math.ceil(target_output_tokens_per_s / per_gpu_tokens_per_s - 1e-9)


def monthly_cost(num_gpus: int, gpu_cost_per_hour: float, hours: float = HOURS_PER_MONTH) -> float:
    """Rent of `num_gpus` accelerators for a month of `hours` hours."""
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0:
        raise ValueError(f"num_gpus must be an int >= 0, got {num_gpus!r}")
    for name, value in (("gpu_cost_per_hour", gpu_cost_per_hour), ("hours", hours)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
                or math.isinf(value):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return num_gpus * gpu_cost_per_hour * hours


@dataclass(frozen=True)
class FleetPlan:
    """A fleet sized for a target load at an SLO, from one sweep point."""

    target_output_tokens_per_s: float
    slo: SLO
    chosen: Measurement  # the sweep point that sets the per-GPU throughput
    num_gpus: int
    monthly_cost: float
    cost_per_mtok: float  # at the target load, the fleet's whole rent over its tokens

    def describe(self, currency: str = "$") -> str:
        per_gpu = self.chosen.output_tokens_per_s / self.chosen.num_gpus
        return (
            f"{self.target_output_tokens_per_s:,.0f} output tokens/s at {self.slo.describe()}: "
            f"{per_gpu:,.0f} tokens/s per GPU -> {self.num_gpus} GPUs, "
            f"{currency}{self.monthly_cost:,.0f} a month, {currency}{self.cost_per_mtok:.3g} per "
            f"Mtok (from {self.chosen.provenance.describe()})"
        )


def plan_fleet(
    sweep: Sequence[Measurement], slo: SLO, target_output_tokens_per_s: float,
    gpu_cost_per_hour: float,
) -> FleetPlan:
    """GPUs needed, monthly rent and cost per Mtok for a target load at an SLO."""
    chosen = throughput_at_slo(sweep, slo)
    n = gpus_needed(target_output_tokens_per_s, chosen.output_tokens_per_s / chosen.num_gpus)
    rent = monthly_cost(n, gpu_cost_per_hour)
    tokens_per_month = target_output_tokens_per_s * HOURS_PER_MONTH * SECONDS_PER_HOUR
    return FleetPlan(target_output_tokens_per_s, slo, chosen, n, rent,
                     rent / tokens_per_month * TOKENS_PER_MILLION)
