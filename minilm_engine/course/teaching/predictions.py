"""Prediction cells: the learner's guess, written before a run, printed beside what the run measured.

Contract: `guess_vs_measured(label, guess, measured, unit)` returns one line; a guess still `...`
(the cell left as it came) says so instead of failing, so a notebook runs top to bottom in CI.
A numeric guess is compared by ratio (measured / guess), a choice by equality.
"""

from __future__ import annotations


def guess_vs_measured(label: str, guess, measured, unit: str = "") -> str:
    if guess is Ellipsis or guess is None:
        return f"{label}: no guess written (replace the ... above); measured {_fmt(measured, unit)}"
    if isinstance(guess, (int, float)) and isinstance(measured, (int, float)) and not isinstance(guess, bool):
        off = f", {measured / guess:.2g}x your guess" if guess else ""
        return f"{label}: you guessed {_fmt(guess, unit)}, measured {_fmt(measured, unit)}{off}"
    verdict = "right" if guess == measured else "not what happened"
    return f"{label}: you guessed {guess!r}, measured {measured!r} ({verdict})"


def _fmt(value, unit: str) -> str:
    if isinstance(value, float):
        return f"{value:.3g}{unit}"
    return f"{value}{unit}"
