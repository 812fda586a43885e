"""The "Your turn" exercises of chapter 08 (the cost ledger).

The stored cases (course/teaching/fixtures/break_even_output_price.json, gpus_for_load.json) are
answered by thin wrappers over the package's own ledger (`minilm_engine.course.ledger`), taking plain
numbers, so a learner can write them with nothing but arithmetic.  The random cases are built
so that the usual slips fail: forgetting that idle hours are paid too (utilization), pricing a
million tokens per second instead of per hour, forgetting the input tokens' revenue, taking the
fastest sweep point instead of the fastest that meets the SLO, and rounding a fleet down.
"""

from __future__ import annotations

import math
import random

from minilm_engine.course.ledger import (
    SLO,
    Ledger,
    Measurement,
    Prices,
    Provenance,
    gpus_needed,
    throughput_at_slo,
)
from minilm_engine.course.teaching.exercises import Exercise

_PROVENANCE = Provenance(machine="exercise", model="exercise", source="exercise")


def engine_break_even_output_price(
    gpu_cost_per_hour: float, utilization: float, output_tokens_per_s: float,
    input_tokens_per_s: float, input_price_per_mtok: float,
) -> float:
    """The output price per million tokens at which a machine breaks even, given what it costs,
    how busy it is, how fast it reads and writes tokens, and what input tokens sell for."""
    measurement = Measurement(
        _PROVENANCE, num_requests=1, duration_s=1000.0,
        num_input_tokens=round(input_tokens_per_s * 1000),
        num_output_tokens=round(output_tokens_per_s * 1000),
    )
    prices = Prices(gpu_cost_per_hour, utilization=utilization,
                    input_price_per_mtok=input_price_per_mtok, output_price_per_mtok=1.0)
    return Ledger(measurement, prices).break_even_output_price()


def engine_gpus_for_load(target_tokens_per_s: float, sweep: list[dict], p99_ttft_limit_s: float) -> int | None:
    """GPUs needed to serve `target_tokens_per_s` output tokens per second when each GPU may be
    loaded only as far as the sweep point with the most tokens/s whose p99 TTFT is within the
    limit; None when no point of the sweep meets the limit.

    `sweep`: one dict per measured load, {"tokens_per_s": ..., "p99_ttft_s": ...}, one GPU each.
    """
    points = [
        Measurement(_PROVENANCE, num_requests=1, num_input_tokens=0,
                    num_output_tokens=round(p["tokens_per_s"] * 1000), duration_s=1000.0,
                    ttft_s={99: p["p99_ttft_s"]})
        for p in sweep
    ]
    try:
        best = throughput_at_slo(points, SLO(ttft_s=p99_ttft_limit_s))
    except ValueError:
        return None
    return gpus_needed(target_tokens_per_s, best.output_tokens_per_s)


def make_break_even_case(rng: random.Random) -> dict:
    return {
        "gpu_cost_per_hour": round(rng.uniform(0.5, 12.0), 2),
        "utilization": rng.choice([1.0, 0.8, 0.6, 0.45, 0.3]),
        "output_tokens_per_s": float(rng.randrange(100, 20_000, 10)),
        "input_tokens_per_s": float(rng.choice([0, rng.randrange(100, 60_000, 10)])),
        "input_price_per_mtok": rng.choice([0.0, 0.05, 0.1, 0.5, 1.0]),
    }


def make_fleet_case(rng: random.Random) -> dict:
    # Throughput rises with load, and so does the tail latency: the usual knee.
    rates = sorted(rng.sample(range(1, 64), rng.randint(2, 6)))
    base = rng.uniform(50, 2000)
    sweep = []
    for rate in rates:
        sweep.append({"tokens_per_s": round(base * rate / (1 + rate / 16), 1),
                      "p99_ttft_s": round(0.05 * (1 + (rate / 12) ** 2), 3)})
    limit = rng.choice([0.06, 0.1, 0.2, 0.5, 2.0, 0.01])
    per_gpu = max((p["tokens_per_s"] for p in sweep), default=1.0)
    target = round(per_gpu * rng.uniform(0.5, 40), 1)
    if rng.random() < 0.2:  # exactly a whole number of the best GPUs: no rounding up
        meeting = [p["tokens_per_s"] for p in sweep if p["p99_ttft_s"] <= limit]
        if meeting:
            target = max(meeting) * rng.randint(1, 9)
    return {"target_tokens_per_s": target, "sweep": sweep, "p99_ttft_limit_s": limit}


def _close(got, want) -> bool:
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return False
    return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)


def _same_count(got, want) -> bool:
    if want is None:
        return got is None
    return not isinstance(got, bool) and isinstance(got, int) and got == want


BREAK_EVEN = Exercise(
    "break_even_output_price(gpu_cost_per_hour, utilization, output_tokens_per_s, "
    "input_tokens_per_s, input_price_per_mtok)",
    "break_even_output_price",  # cases answered by engine_break_even_output_price (ledger.Ledger)
    compare=_close,
    hint="Per hour: the machine costs gpu_cost_per_hour / utilization per hour of serving "
    "(idle hours are paid too); subtract what the input tokens of that hour earn; divide the "
    "rest by the millions of output tokens of that hour.",
    shows=("minilm_engine.course.ledger:Ledger.break_even_output_price",),
    package=("minilm_engine.course.teaching.exercises_ledger:engine_break_even_output_price",),
    solutions="08_cost_ledger_solutions.ipynb",
)

GPUS_FOR_LOAD = Exercise(
    "gpus_for_load(target_tokens_per_s, sweep, p99_ttft_limit_s)",
    "gpus_for_load",  # cases answered by engine_gpus_for_load (ledger.throughput_at_slo, gpus_needed)
    compare=_same_count,
    hint="Keep only the sweep points whose p99_ttft_s is within the limit; the best of those "
    "sets what one GPU may carry; a fleet is a whole number of GPUs (math.ceil); None when no "
    "point qualifies.",
    shows=("minilm_engine.course.ledger:throughput_at_slo", "minilm_engine.course.ledger:gpus_needed"),
    package=("minilm_engine.course.teaching.exercises_ledger:engine_gpus_for_load",),
    solutions="08_cost_ledger_solutions.ipynb",
)
