"""The batch tier's discount from a measured run (`course/experiments/tiers.py`), not an assumption.

A machine-hour costs the same whoever's tokens it makes.  Serving interactive traffic alone, at
the load measured, the engine makes I tokens a second: the rest of its capacity idles, kept free
so that latency stays low.  With a backlog of batch-tier requests filling what interactive work
leaves (scheduling_policy="priority", interactive latency kept), it makes I + B:

    cost per Mtok, interactive alone   = cost_per_million_tokens(gpu $/h / utilization, I)
    cost per Mtok, with the backlog    = cost_per_million_tokens(gpu $/h / utilization, I + B)
    batch-tier discount                = 1 - I / (I + B)

the share of a token's cost that the batch tier's relaxed latency saves: priced at that
discount, the backlog's tokens cost the provider what they bring in.  The throughputs are the
medians over the run's repeats, so a noisy repeat does not set the price.

`Prices.batch_discount` stays a plain number (the ledger's API is unchanged);
`with_measured_batch_discount(prices, result)` returns the price list with the measured one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from minilm_engine.course.experiments.cost import cost_per_million_tokens
from minilm_engine.course.experiments.tiers import TiersResult, median_of
from minilm_engine.course.ledger.prices import Prices


@dataclass(frozen=True)
class BatchTierPrice:
    interactive_tokens_per_s: float  # I: output tokens/s serving interactive traffic alone
    with_backlog_tokens_per_s: float  # I + B: all output tokens/s with the batch backlog
    interactive_cost_per_mtok: float
    with_backlog_cost_per_mtok: float

    @property
    def discount(self) -> float:
        """1 - I / (I + B), 0 when the backlog bought nothing (a noisy run)."""
        return max(0.0, 1 - self.interactive_tokens_per_s / self.with_backlog_tokens_per_s)


def batch_tier_price(result: TiersResult, prices: Prices) -> BatchTierPrice:
    """The measured batch tier, from the priority policy's runs alone and with the backlog."""
    alone = median_of(result, "priority", False, "all tok/s")
    with_backlog = median_of(result, "priority", True, "all tok/s")
    hourly = prices.gpu_cost_per_hour / prices.utilization  # idle hours are paid too
    return BatchTierPrice(alone, with_backlog, cost_per_million_tokens(hourly, alone),
                          cost_per_million_tokens(hourly, with_backlog))


def with_measured_batch_discount(prices: Prices, result: TiersResult) -> Prices:
    """`prices` with `batch_discount` set from the run (every other field as it was)."""
    return replace(prices, batch_discount=batch_tier_price(result, prices).discount)
