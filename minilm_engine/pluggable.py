"""Named, replaceable pieces of the engine: the seams where another function may run instead.

Contract: a function decorated `@replaceable("kv_cache.slot_mapping")` runs as written until
`override(name, fn)` (a context manager) installs a replacement: inside it, every call, from
anywhere in the engine, goes to `fn`.  A replacement that calls the decorated function gets the
original, and `num_delegations(name)` counts such calls (a replacement that only hands the work
back).  Overrides are process-wide and never nest for one name.  The engine knows nobody who
installs: `course/teaching/build.py` swaps a learner's function in.

    core:      @replaceable("scheduler.preemption_victim")
               def preemption_victim(candidates): ...        <- the package's own piece
    caller:    with override("scheduler.preemption_victim", my_fn):
                   llm.generate(...)                          <- the engine calls my_fn
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_defaults: dict[str, Callable[..., Any]] = {}  # name -> the package's own function
_dispatchers: dict[str, Callable[..., Any]] = {}  # name -> the decorated function callers hold
_active: dict[str, Callable[..., Any]] = {}  # name -> the installed replacement
_depth: dict[str, int] = {}  # name -> how many calls of the replacement are under way
_delegations: dict[str, int] = {}  # name -> calls the replacement handed back to the original
_calls: dict[str, int] = {}  # name -> calls that reached the replacement


def replaceable(name: str) -> Callable[[F], F]:
    """Register the decorated function as the piece `name` (module docstring)."""

    def register(fn: F) -> F:
        if name in _defaults:
            raise ValueError(f"replaceable piece {name!r} is registered twice")
        _defaults[name] = fn

        @functools.wraps(fn)
        def dispatch(*args: Any, **kwargs: Any) -> Any:
            replacement = _active.get(name)
            if replacement is None:
                return fn(*args, **kwargs)
            if _depth.get(name, 0):
                # The replacement called the package's own piece: answer with the original.
                _delegations[name] = _delegations.get(name, 0) + 1
                return fn(*args, **kwargs)
            _calls[name] = _calls.get(name, 0) + 1
            _depth[name] = 1
            try:
                return replacement(*args, **kwargs)
            finally:
                _depth[name] = 0

        _dispatchers[name] = dispatch
        return dispatch  # type: ignore[return-value]

    return register


def piece_names() -> list[str]:
    """Every registered piece (only those whose modules have been imported)."""
    return sorted(_defaults)


def default(name: str) -> Callable[..., Any]:
    """The package's own function for the piece `name`."""
    _known(name)
    return _defaults[name]


def is_package_function(name: str, fn: Any) -> bool:
    """Whether `fn` is the package's own piece `name` (the original or what callers import)."""
    _known(name)
    unwrapped = getattr(fn, "__wrapped__", None)
    return fn is _defaults[name] or fn is _dispatchers[name] or unwrapped is _defaults[name]


def is_overridden(name: str) -> bool:
    """Whether a replacement for piece `name` is installed (a batched path then yields to it)."""
    _known(name)
    return name in _active


def num_delegations(name: str) -> int:
    """Calls of piece `name` that the current or last replacement handed back to the package."""
    return _delegations.get(name, 0)


def num_calls(name: str) -> int:
    """Calls of piece `name` that reached the current or last replacement."""
    return _calls.get(name, 0)


@contextmanager
def override(name: str, fn: Callable[..., Any]) -> Iterator[None]:
    """Run `fn` in place of piece `name` inside the `with` block; counters start at zero."""
    _known(name)
    if name in _active:
        raise RuntimeError(f"piece {name!r} is already overridden; overrides do not nest")
    if not callable(fn):
        raise TypeError(f"a replacement for {name!r} must be callable, got {type(fn).__name__}")
    _active[name] = fn
    _delegations[name] = _calls[name] = 0
    try:
        yield
    finally:
        del _active[name]
        _depth[name] = 0


def _known(name: str) -> None:
    if name not in _defaults:
        raise KeyError(f"no replaceable piece {name!r}; known: {piece_names()}")
