"""The cost ledger: measured runs and a price list turned into the books of a serving business.

    from minilm_engine.course.ledger import Ledger, Measurement, Prices
    m = Measurement.from_outputs(outputs, wall_s, model="noodle-chef", trace_records=records)
    books = Ledger(m, Prices(gpu_cost_per_hour=2.5, input_price_per_mtok=0.5,
                             output_price_per_mtok=2.0))
    books.to_dataframe()          # every figure, how it was computed, and what it was measured on

`measurement.py` reads runs (offline `generate`, `bench serve` JSON), `prices.py` holds the price
list, `books.py` does the arithmetic (costs, break-even, margin, GPUs for a load at an SLO),
`ladder.py` measures the same workload through the ladder of serving techniques.
"""

from minilm_engine.course.ledger.books import (
    SLO,
    FleetPlan,
    Ledger,
    LedgerEntry,
    gpus_needed,
    monthly_cost,
    plan_fleet,
    throughput_at_slo,
)
from minilm_engine.course.ledger.measurement import Measurement, Provenance, fit_token_seconds, this_machine
from minilm_engine.course.ledger.prices import HOURS_PER_MONTH, Prices

__all__ = [
    "HOURS_PER_MONTH",
    "SLO",
    "FleetPlan",
    "Ledger",
    "LedgerEntry",
    "Measurement",
    "Prices",
    "Provenance",
    "fit_token_seconds",
    "gpus_needed",
    "monthly_cost",
    "plan_fleet",
    "this_machine",
    "throughput_at_slo",
]
