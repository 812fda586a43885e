"""Chapter 01's exercises: count what the two batching policies do with the same requests.

    continuous_steps:  how many steps continuous batching needs for `lengths` on `num_seats`
                       seats (fixture from `toy_simulator.continuous_num_steps`)
    static_padding:    how many seat-steps static batching spends on finished requests
                       (fixture from `toy_simulator.static_padding_waste`)

Both take `(lengths, num_seats)`: `lengths[i]` >= 1 tokens for request i, served in order.
Cases are small and random, with the edge cases mixed in (one seat, more seats than requests,
equal lengths, no requests at all), so the first failing case is short enough to read.
"""

from __future__ import annotations

import random

from minilm_engine.course.teaching.exercises import Exercise


def make_batching_case(rng: random.Random) -> dict:
    """Random `lengths` (0-12 requests of 1-20 tokens) and `num_seats` (1-6)."""
    kind = rng.random()
    num_requests = rng.randint(0, 12) if kind > 0.1 else rng.randint(0, 3)
    if kind < 0.2:
        lengths = [rng.randint(1, 20)] * num_requests  # everyone eats at the same speed
    else:
        lengths = [rng.randint(1, 20) for _ in range(num_requests)]
    return {"lengths": lengths, "num_seats": rng.randint(1, 6)}


continuous_steps = Exercise(
    "continuous_num_steps",
    "continuous_num_steps",
    hint=(
        "Keep, for every seat, the step at which it is free again (all start free at step 0). "
        "Each request in turn takes the seat that frees first and holds it for `length` steps. "
        "The answer is the step at which the last seat frees. `heapq` makes 'the seat that frees "
        "first' one call; a plain `min` over a list works too."
    ),
    shows=("minilm_engine.course.experiments.toy_simulator:continuous_num_steps",),
    solutions="01_batching_solutions.ipynb",
)

static_padding = Exercise(
    "static_padding_waste",
    "static_padding_waste",
    hint=(
        "Cut `lengths` into tables of `num_seats` requests (the last table may be smaller). "
        "A table runs for as many steps as its longest request; every other guest sits idle "
        "for (longest - own length) of those steps. Sum that over all guests of all tables."
    ),
    shows=("minilm_engine.course.experiments.toy_simulator:static_padding_waste",),
    solutions="01_batching_solutions.ipynb",
)

__all__ = ["continuous_steps", "make_batching_case", "static_padding"]
