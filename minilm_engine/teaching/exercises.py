"""Exercises with checkers: the learner writes a function, the package's own is the reference.

Contract: `Exercise(name, reference, make_case)` runs `check(fn)` on `num_cases` random cases
from `make_case(rng)`, compares the learner's result with the reference's, and reports the
first case that differs in plain words.  `solution()` shows the reference's real source,
folded away until clicked.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class CheckResult:
    passed: bool
    num_cases: int
    message: str

    def _repr_html_(self) -> str:
        color = "#1a7f37" if self.passed else "#cf222e"
        icon = "✅" if self.passed else "❌"
        return f'<div style="color:{color}"><b>{icon} {self.message}</b></div>'

    def __repr__(self) -> str:
        return ("PASS: " if self.passed else "FAIL: ") + self.message


class Exercise:
    def __init__(
        self,
        name: str,
        reference: Callable[..., Any],
        make_case: Callable[[random.Random], dict[str, Any]],
        compare: Callable[[Any, Any], bool] | None = None,
        hint: str = "",
    ):
        self.name = name
        self.reference = reference
        self.make_case = make_case
        self.compare = compare or (lambda got, want: got == want)
        self.hint_text = hint

    def check(self, fn: Callable[..., Any], num_cases: int = 50, seed: int = 0) -> CheckResult:
        rng = random.Random(seed)
        for i in range(num_cases):
            case = self.make_case(rng)
            want = self.reference(**case)
            try:
                got = fn(**case)
            except NotImplementedError:
                return CheckResult(False, i, f"{self.name}: not implemented yet")
            except Exception as e:  # the learner's bug, reported rather than raised
                return CheckResult(False, i, f"{self.name} raised {type(e).__name__}: {e} on input {case}")
            if not self.compare(got, want):
                return CheckResult(
                    False, i, f"{self.name}: on input {case} you returned {got!r}, expected {want!r}"
                )
        return CheckResult(True, num_cases, f"{self.name}: all {num_cases} random cases match the engine")

    def hint(self) -> str:
        return self.hint_text

    def solution(self):
        """The package's own implementation, folded (click to reveal)."""
        from IPython.display import HTML
        import html

        source = html.escape(inspect.getsource(self.reference))
        return HTML(
            f"<details><summary>Show the solution ({self.reference.__qualname__})</summary>"
            f"<pre>{source}</pre></details>"
        )
