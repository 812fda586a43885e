"""Exercises with checkers: the learner writes a function, the checker runs it on stored cases.

Contract: `Exercise(name, fixture, ...)` reads `fixtures/<fixture>.json`, a list of
`{"inputs": {...}, "expected": ...}` cases whose expected answers were computed once from the
package's own code by `scripts/make_exercise_fixtures.py` (tests/test_exercises.py recomputes
them, so they cannot drift).  The checker holds no function a notebook could call to get the
answers.  `check(fn)` runs the learner's function on every case, compares inside the same
`try` (an answer of the wrong type gets feedback, never a traceback) and reports the first case
that differs in plain words.  `decode` turns a stored case into the function's arguments (a
config object, a torch dtype).  The package's own function (`package`, by default what
`shows` names) is recognised, passed directly or called from inside the learner's function,
and answered with a nudge, not a pass, as the build checker (`build.check`) does.  `solution()` shows the package's real code, folded, and links
the worked solutions in `notebooks/solutions/`.
"""

from __future__ import annotations

import html
import importlib
import inspect
import json
import math
import numbers
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

FIXTURES_DIR = Path(__file__).parent / "fixtures"


class StoredCases:
    """Cases kept in `fixtures/<fixture>.json`, read from the file on every use (a checker never
    judges against a copy that the learner's code could have changed)."""

    def __init__(self, fixture: str) -> None:
        self.fixture = fixture

    def _stored(self) -> list[dict]:
        return json.loads((FIXTURES_DIR / f"{self.fixture}.json").read_text())

    @property
    def num_cases(self) -> int:
        return len(self._stored())


@dataclass
class CheckResult:
    passed: bool
    num_cases: int
    message: str

    def _repr_html_(self) -> str:
        color = "#1a7f37" if self.passed else "#cf222e"
        icon = "✅" if self.passed else "❌"
        return f'<div style="color:{color}"><b>{icon} {html.escape(self.message)}</b></div>'

    def __repr__(self) -> str:
        return ("PASS: " if self.passed else "FAIL: ") + self.message


def exact(got: Any, want: Any) -> bool:
    """Equal, and of the same kind: a tuple is not accepted for a list, nor 3.0 for 3."""
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    if isinstance(want, int):
        return isinstance(got, numbers.Integral) and got == want
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(exact, got, want))
    return got == want


def close(got: Any, want: Any, rel_tol: float = 1e-9) -> bool:
    """A real number within `rel_tol` of the expected one."""
    return (
        isinstance(got, (int, float))
        and not isinstance(got, bool)
        and math.isclose(got, want, rel_tol=rel_tol)
    )


def _kind(value: Any) -> str:
    return type(value).__name__


class Exercise:
    """One "Your turn" function and its checker (see the module docstring)."""

    def __init__(
        self,
        name: str,
        fixture: str,
        *,
        decode: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        compare: Callable[[Any, Any], bool] = exact,
        hint: str = "",
        shows: tuple[str, ...] = (),
        solutions: str = "",
        package: tuple[str, ...] = (),
    ):
        """fixture: the stored cases' file name in fixtures/ (without .json);
        shows: the package code the solution reveals, as "module:qualname" strings;
        solutions: the notebook in notebooks/solutions/ with the worked solution;
        package: other package functions that answer the exercise (passing or calling one, or
        one of `shows`, gets the nudge)."""
        if not isinstance(fixture, str):
            raise TypeError(f"{name}: give the stored cases' fixture name (see exercise_fixtures.py)")
        self.name = name
        self.fixture = fixture
        self.decode = decode or (lambda raw: dict(raw))
        self.compare = compare
        self.hint_text = hint
        self.shows = shows
        self.solutions = solutions
        self.package = (*shows, *package)

    @cached_property
    def cases(self) -> list[dict[str, Any]]:
        return json.loads((FIXTURES_DIR / f"{self.fixture}.json").read_text())

    def check(self, fn: Callable[..., Any], num_cases: int | None = None) -> CheckResult:
        cases = self.cases[:num_cases] if num_cases else self.cases
        if not callable(fn):
            return CheckResult(False, 0, f"{self.name}: pass your function itself, got {fn!r}")
        own = package_functions(self.package)
        if _unwrap(fn) in own:
            return CheckResult(False, 0, nudge(self.name, _unwrap(fn).__qualname__, self.hint_text))
        with CallWatch(own) as watch:
            result = self._run_cases(fn, cases)
        if watch.called:
            return CheckResult(False, result.num_cases, nudge(self.name, watch.called[0], self.hint_text)
                               + " (your function calls it.)")
        return result

    def _run_cases(self, fn: Callable[..., Any], cases: list[dict[str, Any]]) -> CheckResult:
        for i, stored in enumerate(cases):
            case = self.decode(stored["inputs"])
            want = stored["expected"]
            try:
                got = fn(**case)
                ok = self.compare(got, want)
            except NotImplementedError:
                return CheckResult(False, i, f"{self.name}: not implemented yet")
            except Exception as e:  # noqa: BLE001 - the learner's bug, reported rather than raised
                return CheckResult(
                    False, i, f"{self.name} raised {type(e).__name__}: {e} on input {_show(case)}"
                )
            if not ok:
                kinds = f" (a {_kind(got)}; expected a {_kind(want)})" if _kind(got) != _kind(want) else ""
                return CheckResult(
                    False,
                    i,
                    f"{self.name}: on input {_show(case)} you returned {got!r}{kinds}, expected {want!r}",
                )
        return CheckResult(True, len(cases), f"{self.name}: all {len(cases)} cases match the engine")

    def hint(self) -> str:
        return self.hint_text

    def solution(self):
        """The package's own code for it, folded (click to reveal), and where the worked
        solution lives."""
        from IPython.display import HTML

        parts = []
        for target in self.shows:
            obj = resolve(target)
            source = html.escape(inspect.getsource(obj))
            parts.append(
                f"<details><summary>The engine's code: {html.escape(obj.__qualname__)}</summary>"
                f"<pre>{source}</pre></details>"
            )
        if self.solutions:
            parts.append(
                f"<p>A worked solution, explained: <a href='solutions/{self.solutions}'>"
                f"solutions/{self.solutions}</a></p>"
            )
        return HTML("\n".join(parts))


def resolve(target: str) -> Any:
    """"package.module:Class.attr" -> the object."""
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _unwrap(obj: Any) -> Any:
    """The plain function under a bound method, `functools.wraps` or a `pluggable` dispatcher."""
    obj = getattr(obj, "__func__", obj)
    while hasattr(obj, "__wrapped__"):
        obj = obj.__wrapped__
    return obj


def package_functions(targets: tuple[str, ...]) -> dict[Any, str]:
    """The package's functions named by "module:qualname" strings, unwrapped (a class: its own
    methods), each with its qualified name."""
    found: dict[Any, str] = {}
    for target in targets:
        try:
            obj = resolve(target)
        except (ImportError, AttributeError):
            continue
        members = vars(obj).values() if inspect.isclass(obj) else (obj,)
        for member in members:
            member = _unwrap(member)
            if inspect.isfunction(member):
                found[member] = member.__qualname__
    return found


class CallWatch:
    """While open, records the package functions of `own` that get called (a profile hook on
    Python calls; the previous hook, a debugger's, is put back on exit)."""

    def __init__(self, own: dict[Any, str]) -> None:
        self.codes = {f.__code__: name for f, name in own.items()}
        self.called: list[str] = []

    def _hook(self, frame, event, arg) -> None:
        if event == "call" and frame.f_code in self.codes and not self.called:
            self.called.append(self.codes[frame.f_code])

    def __enter__(self) -> CallWatch:
        self._previous = sys.getprofile()
        if self.codes:
            sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(self._previous)


def nudge(name: str, qualname: str, hint: str) -> str:
    """What a checker answers to the package's own function (as `build.check` does)."""
    idea = f" (hint: {hint})" if hint else ""
    return (
        f"{name}: that is the package's own {qualname}: it works, of course, but the exercise is to "
        f"write it yourself. Close the package's source, write the function from the idea{idea}, "
        f"and check again."
    )


def _show(case: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={v!r}" for k, v in case.items()) + ")"
