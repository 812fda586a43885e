"""Tests for minilm_engine.course.experiments.diners: the seed's speed toy against chapter 01's step toy."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minilm_engine.course.experiments.diners import (
    comparison_rows,
    compare_toys,
    draw_speeds,
    engine_on_diners,
    play_seed_toy,
    rounds_to_finish,
)


@given(speed=st.floats(0.4, 1.2))
def test_rounds_to_finish_is_the_length_in_disguise(speed: float) -> None:
    exact = math.ceil(1 / (0.1 * speed))
    # The seed adds the bite in floating point: 0.1 added ten times is 0.9999999999999999,
    # so a diner sometimes needs one round more than the exact division says.
    assert rounds_to_finish(speed) in (exact, exact + 1)
    assert 9 <= rounds_to_finish(speed) <= 26


def test_rounds_to_finish_refuses_nonsense() -> None:
    assert rounds_to_finish(1.0) == 11  # the float quirk above, kept as the seed's loop has it
    with pytest.raises(ValueError, match="positive"):
        rounds_to_finish(0)
    with pytest.raises(ValueError, match="positive"):
        rounds_to_finish("fast")


def test_the_seed_toy_as_it_runs() -> None:
    static = play_seed_toy(6, 500, continuous=False, seed=3)
    continuous = play_seed_toy(6, 500, continuous=True, seed=3)
    assert static % 6 == 0  # whole tables leave together
    assert 1.2 < continuous / static < 2.0  # the seed prints a gain of roughly +40-60%
    # One seat: no table to wait for, so the two policies are the same.
    assert play_seed_toy(1, 300, False, seed=1) == play_seed_toy(1, 300, True, seed=1)


def test_both_toys_agree_on_rounds_and_part_on_latency() -> None:
    toys = compare_toys(num_diners=12, num_seats=4, seed=0)
    assert toys.speeds == draw_speeds(12, 0)
    tables = [toys.lengths[i : i + 4] for i in range(0, 12, 4)]
    assert toys.static_rounds == sum(max(t) for t in tables)
    assert toys.continuous_rounds <= toys.static_rounds  # a short queue can end on one long diner
    assert compare_toys(24, 6, seed=0).predicted_speedup > 1
    # The seed's round table: everybody of a table leaves when its slowest diner is done.
    ends = [sum(max(t) for t in tables[: k + 1]) for k in range(3)]
    assert toys.seed_static_latency == [ends[i // 4] for i in range(12)]
    # Chapter 01's static batching: a request finishes at its own length, its seat stays held.
    starts = [0, ends[0], ends[1]]
    assert toys.step_static_latency == [starts[i // 4] + toys.lengths[i] for i in range(12)]
    seed_row, step_row = comparison_rows(toys)
    assert seed_row["continuous gain"] == step_row["continuous gain"] == toys.predicted_speedup
    assert (seed_row["quickest quarter: static / continuous latency"]
            > step_row["quickest quarter: static / continuous latency"])


def test_the_engine_on_the_diners_lengths(checkpoints) -> None:
    toys = compare_toys(num_diners=6, num_seats=2, seed=1)
    engine = engine_on_diners(toys, model=checkpoints["llama"].path)
    assert engine.num_steps["static"] == toys.static_rounds
    assert engine.num_steps["continuous"] >= toys.continuous_rounds
    for policy in ("static", "continuous"):
        assert len(engine.latency_s[policy]) == 6 and engine.wall_s[policy] > 0
        assert engine.seconds_per_step[policy] > 0
    rows = comparison_rows(toys, engine)
    assert rows[-1]["continuous gain"] == pytest.approx(engine.measured_speedup)
