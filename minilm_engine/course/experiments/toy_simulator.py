"""The noodle shop's toy simulation of static vs continuous batching, in pure Python.

A table has `num_seats` seats; each request needs `lengths[i]` steps (one token per step) and
requests are served in order.  Every step costs the same, whoever sits at the table.

    static ("round table"):       a whole table sits down together and leaves together, when
                                  its slowest eater is done; finished guests keep their seats.
    continuous ("sushi belt"):    a seat is refilled the step after its guest finishes.

    lengths 3 1 4 1 5 2, 3 seats          static                  continuous
                                 seat 0 │ 0 0 0 · 3 · · · ·     seat 0 │ 0 0 0 5 5
                                 seat 1 │ 1 · · · 4 4 4 4 4     seat 1 │ 1 3 4 4 4 4 4
                                 seat 2 │ 2 2 2 2 5 5 · · ·     seat 2 │ 2 2 2 2
                                          9 steps; "·" = a seat    7 steps
                                          held by a finished guest

`simulate(lengths, num_seats, "static" | "continuous")` plays it step by step and records who
sat where (`SimResult`); `continuous_num_steps` and `static_padding_waste` compute two of its
numbers directly (they are the chapter's exercises, and the tests check they agree).  The real
engines do the same when every prompt fits one step: `StaticBatchStrategy` runs a batch until
its longest request ends, the continuous scheduler admits a waiting request as soon as a running
one finishes, so the toy's step counts are the engines' step counts.  The toy cannot know that
a real step's cost grows with the number of rows in it; chapter 01 measures that part.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Literal

Policy = Literal["static", "continuous"]
POLICIES: tuple[str, ...] = ("static", "continuous")


@dataclass
class SimResult:
    """Where and when each request sat.  Steps count from 0; request i holds seat `seats[i]`
    during steps [start_steps[i], release_steps[i]) and produces tokens during
    [start_steps[i], finish_steps[i]), so finish = start + length <= release."""

    policy: str
    num_seats: int
    lengths: list[int]
    seats: list[int]
    start_steps: list[int]
    finish_steps: list[int]
    release_steps: list[int]

    @property
    def num_steps(self) -> int:
        return max(self.release_steps, default=0)

    @property
    def num_busy_seat_steps(self) -> int:
        """Seat-steps that produced a token: the useful work, sum(lengths)."""
        return sum(self.lengths)

    @property
    def num_padding_seat_steps(self) -> int:
        """Seat-steps held by a guest who had already finished (static batching's padding rows)."""
        return sum(r - f for r, f in zip(self.release_steps, self.finish_steps))

    @property
    def num_empty_seat_steps(self) -> int:
        """Seat-steps with nobody seated (the queue had run dry, or the last table was small)."""
        held = sum(r - s for r, s in zip(self.release_steps, self.start_steps))
        return self.num_steps * self.num_seats - held

    @property
    def utilization(self) -> float:
        """Share of all seat-steps that produced a token."""
        total = self.num_steps * self.num_seats
        return self.num_busy_seat_steps / total if total else 0.0

    def num_served_by(self, step: int) -> int:
        """Requests finished within the first `step` steps (the shop's "table turnover")."""
        return sum(f <= step for f in self.finish_steps)

    def grid(self) -> list[list[tuple[int, bool] | None]]:
        """grid[seat][step] = (request index, still producing tokens) or None for an empty seat."""
        cells: list[list[tuple[int, bool] | None]] = [
            [None] * self.num_steps for _ in range(self.num_seats)
        ]
        for i, seat in enumerate(self.seats):
            for step in range(self.start_steps[i], self.release_steps[i]):
                cells[seat][step] = (i, step < self.finish_steps[i])
        return cells

    def busy_seats_per_step(self) -> list[int]:
        """How many seats produced a token in each step."""
        busy = [0] * self.num_steps
        for start, finish in zip(self.start_steps, self.finish_steps):
            for step in range(start, finish):
                busy[step] += 1
        return busy


def simulate(lengths: list[int], num_seats: int, policy: Policy) -> SimResult:
    """Play the shop step by step; `lengths[i]` >= 1 tokens for request i, served in order."""
    _check(lengths, num_seats)
    if policy == "static":
        return _simulate_static(lengths, num_seats)
    if policy == "continuous":
        return _simulate_continuous(lengths, num_seats)
    raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")


def _simulate_static(lengths: list[int], num_seats: int) -> SimResult:
    n = len(lengths)
    seats, starts, releases = [0] * n, [0] * n, [0] * n
    step = 0
    for first in range(0, n, num_seats):
        table = range(first, min(first + num_seats, n))
        end = step + max(lengths[i] for i in table)  # the slowest guest decides
        for seat, i in enumerate(table):
            seats[i], starts[i], releases[i] = seat, step, end
        step = end
    finishes = [s + length for s, length in zip(starts, lengths)]
    return SimResult("static", num_seats, list(lengths), seats, starts, finishes, releases)


def _simulate_continuous(lengths: list[int], num_seats: int) -> SimResult:
    n = len(lengths)
    seats, starts, finishes = [0] * n, [0] * n, [0] * n
    queue = deque(range(n))
    seated: dict[int, int] = {}  # seat -> request now in it
    remaining = list(lengths)
    step = 0
    while queue or seated:
        # 1. Refill every free seat from the queue, lowest seat first.
        for seat in range(num_seats):
            if seat not in seated and queue:
                i = queue.popleft()
                seated[seat], seats[i], starts[i] = i, seat, step
        # 2. Everyone seated eats one mouthful (produces one token); the done leave.
        for seat, i in list(seated.items()):
            remaining[i] -= 1
            if remaining[i] == 0:
                finishes[i] = step + 1
                del seated[seat]
        step += 1
    return SimResult(
        "continuous", num_seats, list(lengths), seats, starts, finishes, list(finishes)
    )


def continuous_num_steps(lengths: list[int], num_seats: int) -> int:
    """Steps continuous batching needs for `lengths` on `num_seats` seats.

    Each request, in order, takes the seat that frees first (a min-heap of the steps at which
    seats free up) and keeps it for `length` steps; the answer is when the last seat frees.
    """
    free_at = [0] * num_seats  # step at which each seat is free again; a valid heap as is
    for length in lengths:
        start = heapq.heappop(free_at)
        heapq.heappush(free_at, start + length)
    return max(free_at) if lengths else 0


def static_padding_waste(lengths: list[int], num_seats: int) -> int:
    """Seat-steps static batching spends on requests that have already finished.

    Requests sit down in tables of `num_seats` (the last may be smaller); a table runs
    max(lengths of the table) steps, so each guest wastes max - own length steps.
    """
    waste = 0
    for first in range(0, len(lengths), num_seats):
        table = lengths[first : first + num_seats]
        waste += sum(max(table) - length for length in table)
    return waste


def predicted_speedup(lengths: list[int], num_seats: int) -> float:
    """Static steps / continuous steps: the toy's prediction of continuous batching's gain."""
    static = simulate(lengths, num_seats, "static").num_steps
    return static / continuous_num_steps(lengths, num_seats)


def _check(lengths: list[int], num_seats: int) -> None:
    if isinstance(num_seats, bool) or not isinstance(num_seats, int) or num_seats < 1:
        raise ValueError(f"num_seats must be a positive int, got {num_seats!r}")
    bad = [x for x in lengths if isinstance(x, bool) or not isinstance(x, int) or x < 1]
    if bad:
        raise ValueError(f"every length must be an int >= 1, got {bad[:3]}")
