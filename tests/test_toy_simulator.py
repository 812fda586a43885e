"""Tests for minilm_engine.course.experiments.toy_simulator: the toy's bookkeeping, and the shortcuts
(`continuous_num_steps`, `static_padding_waste`) against the step-by-step simulation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minilm_engine.course.experiments.toy_simulator import (
    continuous_num_steps,
    predicted_speedup,
    simulate,
    static_padding_waste,
)

lengths_st = st.lists(st.integers(1, 30), max_size=25)
seats_st = st.integers(1, 8)


def test_docstring_example():
    lengths = [3, 1, 4, 1, 5, 2]
    static, cont = simulate(lengths, 3, "static"), simulate(lengths, 3, "continuous")
    assert static.num_steps == 9 and cont.num_steps == 7
    assert static.num_padding_seat_steps == 11 == static_padding_waste(lengths, 3)
    assert cont.num_padding_seat_steps == 0
    assert cont.seats == [0, 1, 2, 1, 1, 0] and cont.start_steps == [0, 0, 0, 1, 2, 3]
    assert predicted_speedup(lengths, 3) == pytest.approx(9 / 7)
    # seat 1 of the static table: request 1 works one step, then holds the seat three more
    assert [c for c in static.grid()[1]] == [(1, True)] + [(1, False)] * 3 + [(4, True)] * 5


@given(lengths_st, seats_st)
def test_shortcuts_agree_with_the_simulation(lengths, num_seats):
    static = simulate(lengths, num_seats, "static")
    cont = simulate(lengths, num_seats, "continuous")
    assert continuous_num_steps(lengths, num_seats) == cont.num_steps
    assert static_padding_waste(lengths, num_seats) == static.num_padding_seat_steps


@given(lengths_st, seats_st)
def test_conservation_and_bounds(lengths, num_seats):
    for policy in ("static", "continuous"):
        r = simulate(lengths, num_seats, policy)
        total = r.num_steps * num_seats
        # every seat-step is either useful, padding, or empty
        assert r.num_busy_seat_steps + r.num_padding_seat_steps + r.num_empty_seat_steps == total
        assert sum(r.busy_seats_per_step()) == sum(lengths)
        assert all(b <= num_seats for b in r.busy_seats_per_step())
        assert r.num_served_by(r.num_steps) == len(lengths)
        # no two requests in one seat at one step
        cells = r.grid()
        held = sum(c is not None for seat in cells for c in seat)
        assert held == sum(rel - s for rel, s in zip(r.release_steps, r.start_steps))
    cont = simulate(lengths, num_seats, "continuous")
    static = simulate(lengths, num_seats, "static")
    # continuous never takes longer, and no schedule beats the work / seats or the longest request
    assert cont.num_steps <= static.num_steps
    if lengths:
        assert cont.num_steps >= max(max(lengths), -(-sum(lengths) // num_seats))


def test_continuous_refills_a_seat_the_step_after_it_frees():
    r = simulate([1, 5, 2], 2, "continuous")
    assert r.seats == [0, 1, 0] and r.start_steps == [0, 0, 1] and r.finish_steps == [1, 5, 3]


def test_equal_lengths_give_no_gain():
    assert predicted_speedup([7] * 12, 4) == 1.0
    assert static_padding_waste([7] * 12, 4) == 0


def test_empty_workload():
    assert simulate([], 3, "static").num_steps == 0
    assert continuous_num_steps([], 3) == 0 and static_padding_waste([], 3) == 0


@pytest.mark.parametrize(
    "lengths, seats, policy", [([1, 0], 2, "static"), ([1], 0, "static"), ([2], 2, "fifo")]
)
def test_bad_input_is_rejected(lengths, seats, policy):
    with pytest.raises(ValueError):
        simulate(lengths, seats, policy)
