"""Build exercises: the learner writes a piece of the engine, and the real engine runs it.

Contract: `swap_in(piece, fn)` is a context manager that puts the learner's `fn` in place of the
engine's piece (through the core's registry, `minilm_engine/pluggable.py`; no package file is
touched): inside it, `LLM.generate` calls `fn`.  `check(piece, fn)` runs a small real workload
with `fn` swapped in and the same workload on the package's own engine, and answers with a
`BuildResult` that names what broke: the first differing token (request, step, expected vs
got), the leaked block, the starved request, the distribution that is off, the exception the
learner's code raised.  It never raises for a wrong answer.  The package's own function is
recognised (passed directly, or called from inside `fn`) and answered with a nudge, not a pass.
`check_all(pieces)` runs one engine with all of the learner's pieces at once.

The pieces, in the order of the course's build path (`BUILD_PATH`, `notebooks/README.md`):

    chapter  piece                what the learner writes
    02       append_and_attend    write a step's K/V into a contiguous cache, attend over it
    03       slot_mapping         token positions -> cache slots through a block table
    03       share_block          a prefix-cache hit: the block's ref count and the free queue
    03       cached_prefix        the prefix-cache lookup: a prompt's longest run of cached blocks
    03       take_free_blocks     allocation from the free queue's head, evicting cached prefixes (LRU)
    03       release_blocks       freeing: ref counts, the free queue's tail, cached prefixes kept
    01       preemption_victim    out of blocks: which running request gives its blocks up
    01       admits               whether the waiting queue's head starts this step
    01       schedule_step        the scheduler's step: who runs, how many tokens, who is preempted
    04       num_tokens_this_step how many of a request's tokens fit this step's token budget
    05       accept_drafts        speculative sampling's accept / resample rule
    06       int8_weight          per-channel symmetric INT8 quantization of a weight
    06       int4_weight          per-group asymmetric INT4 quantization of a weight
    A1       decode_kernel        the online softmax of the paged decode kernel (Triton)

Each piece is checked twice: first alone, on random inputs against the package's reference
across the branches of its contract (`build_units.py`: several K/V heads per model, chunking on
and off, every token an accept rule emits, any quantizer within the error bound), then in the
engine.  Each piece's learner signature, hint and checker live in `build_pieces.py`
(`build_allocator.py` for the block pool's allocator, `build_schedule.py` for the scheduler's step,
`build_kernels.py` for A1's Triton kernel); the engine runs and their comparison in
`build_runs.py`.
"""

from __future__ import annotations

import html
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minilm_engine import pluggable

PACKAGE_DIR = Path(pluggable.__file__).resolve().parent


@dataclass
class BuildResult:
    """The verdict of a build check; `passed` is True only for the learner's own working code."""

    piece: str
    passed: bool
    message: str
    details: list[str] = field(default_factory=list)  # what was checked, one line each

    def _repr_html_(self) -> str:
        color = "#1a7f37" if self.passed else "#cf222e"
        icon = "✅" if self.passed else "❌"
        lines = "".join(f"<li>{html.escape(d)}</li>" for d in self.details)
        body = html.escape(self.message).replace("\n", "<br>")
        return f'<div style="color:{color}"><b>{icon} {self.piece}: {body}</b><ul>{lines}</ul></div>'

    def __repr__(self) -> str:
        head = ("PASS " if self.passed else "FAIL ") + f"{self.piece}: {self.message}"
        return "\n".join([head, *(f"  - {d}" for d in self.details)])


class PieceError(Exception):
    """The learner's function returned something the engine cannot use (wrong type or shape,
    out of range); the message says what was expected."""


class BuildFailure(Exception):
    """The engine ran with the learner's piece, and its behaviour differs from the reference."""


@dataclass(frozen=True)
class Piece:
    """One replaceable piece as a learner sees it."""

    name: str  # the short name the notebooks use
    registry_name: str  # the core's name in `pluggable`
    chapter: str
    signature: str  # the learner's function, as a `def` line with a docstring-like note
    hint: str  # the idea, not the formula
    adapt: Callable[[Callable[..., Any]], Callable[..., Any]]  # learner fn -> the core's signature
    run_check: Callable[[Callable[..., Any], Any], list[str]]  # raises BuildFailure; returns details
    solutions: str  # notebooks/solutions/<file>
    # Other package functions that are this piece under another signature: passing one, or
    # calling one from the learner's function, is the package's own work too.
    watched: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.signature}\n\nHint: {self.hint}\nWorked solution: notebooks/solutions/{self.solutions}"


_PIECES: dict[str, Piece] = {}


def register_piece(piece: Piece) -> Piece:
    _PIECES[piece.name] = piece
    return piece


def pieces() -> dict[str, Piece]:
    """Every build piece by short name, in build-path order."""
    from minilm_engine.course.teaching import build_allocator, build_kernels, build_pieces, build_schedule  # noqa: F401  (they register the pieces)

    order = {name: i for i, name in enumerate(BUILD_PATH)}
    return dict(sorted(_PIECES.items(), key=lambda item: order.get(item[0], len(order))))


# The pieces in the order of the build path (the table above).
BUILD_PATH = (
    "append_and_attend", "slot_mapping", "share_block", "cached_prefix", "take_free_blocks", "release_blocks",
    "preemption_victim", "admits", "schedule_step", "num_tokens_this_step", "accept_drafts", "int8_weight",
    "int4_weight", "decode_kernel",
)


def get_piece(name: str) -> Piece:
    known = pieces()
    if name not in known:
        raise KeyError(f"no build piece {name!r}; the pieces are {list(known)}")
    return known[name]


def task(piece: str) -> str:
    """What to write for `piece`: the signature, a hint (the idea, not the formula), where the
    worked solution is.  Print it in a notebook."""
    return get_piece(piece).describe()


@contextmanager
def swap_in(piece: str, fn: Callable[..., Any]) -> Iterator[None]:
    """Inside the block, the engine runs the learner's `fn` as `piece` (see `pieces()`)."""
    p = get_piece(piece)
    with pluggable.override(p.registry_name, p.adapt(fn)):
        yield


def _nudge(piece: Piece) -> str:
    return (
        f"that is the package's own {piece.registry_name.split('.')[-1]}: it works, of course, but "
        f"the exercise is to write it yourself. Close the package's source, write the function from "
        f"the idea (hint: {piece.hint}), and check again."
    )


def _is_package(piece: Piece, fn: Any) -> bool:
    names = [n for n in (piece.registry_name, *piece.watched) if n in pluggable.piece_names()]
    # (A piece whose module is not imported yet, a Triton kernel, is recognised by its checker.)
    return any(pluggable.is_package_function(n, fn) for n in names)


@contextmanager
def _watching(piece: Piece) -> Iterator[list[str]]:
    """Count calls of the watched package functions (each runs as itself) while the check runs."""
    with ExitStack() as stack:
        for name in piece.watched:
            stack.enter_context(pluggable.override(name, pluggable.default(name)))
        called: list[str] = []
        yield called
        called += [n for n in piece.watched if pluggable.num_calls(n)]


def _learner_frame(exc: BaseException) -> str | None:
    """'line N in fn_name' of the deepest traceback frame outside the package, if any."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            inside = Path(frame.filename).resolve().is_relative_to(PACKAGE_DIR)
        except (OSError, ValueError):
            inside = False
        if not inside and not _library(frame.filename):
            found = f"line {frame.lineno} of {frame.name}"
    return found


def _library(filename: str) -> bool:
    """A frame of an installed library or of Python itself (torch, contextlib), not the learner's."""
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    return ("site-packages" in filename or "dist-packages" in filename or filename.startswith("<frozen")
            or filename.startswith(stdlib))


def check(piece: str, fn: Any, setup: Any = None) -> BuildResult:
    """Run the real engine with `fn` as `piece` on a small workload; compare with the package's
    own engine.  `setup`: a `build_runs.BuildSetup` (model, draft, sizes); None: the shipped
    noodle-chef and noodle-apprentice."""
    from minilm_engine.course.teaching.build_runs import BuildSetup

    p = get_piece(piece)
    setup = setup if setup is not None else BuildSetup.default()
    if not callable(fn):
        return BuildResult(piece, False, f"expected a function, got {type(fn).__name__} {fn!r:.60}")
    if _is_package(p, fn):
        return BuildResult(piece, False, _nudge(p))
    try:
        with _watching(p) as called:
            details = p.run_check(fn, setup)
    except BuildFailure as e:
        return BuildResult(piece, False, str(e))
    except PieceError as e:
        return BuildResult(piece, False, f"your function's answer cannot be used: {e}")
    except Exception as e:  # the learner's code raised, or the engine choked on its answer
        return BuildResult(piece, False, _describe_exception(e))
    if pluggable.num_delegations(p.registry_name) or called:
        return BuildResult(piece, False, _nudge(p) + " (your function calls it.)")
    return BuildResult(piece, True, "the engine with your piece matches the reference engine", details)


def _describe_exception(e: BaseException) -> str:
    where = _learner_frame(e)
    kind = f"{type(e).__name__}: {e}"
    if where is not None:
        return f"your function raised {kind} (at {where})"
    if "double free" in str(e):
        kind += (" (a block was released more often than the pool counted holders for it: "
                 "does every request that holds a block count in its ref_cnt?)")
    return f"the engine failed while running your piece: {kind}"


def check_all(pieces_by_name: Mapping[str, Any], setup: Any = None) -> BuildResult:
    """One engine with every piece of `pieces_by_name` swapped in at once (the course's final
    check): the continuous engine with speculative decoding, INT8 weights, chunked prefill, prefix
    caching and preemption, then the static batch on the contiguous cache, then the accept
    rule's distribution; greedy tokens against the package's engine, the pool empty after."""
    from minilm_engine.course.teaching.build_all import run_whole_engine
    from minilm_engine.course.teaching.build_runs import BuildSetup

    setup = setup if setup is not None else BuildSetup.default()
    known = pieces()
    unknown = sorted(set(pieces_by_name) - set(known))
    if unknown:
        return BuildResult("all", False, f"unknown pieces {unknown}; the pieces are {list(known)}")
    for name, fn in pieces_by_name.items():
        if not callable(fn):
            return BuildResult("all", False, f"{name}: expected a function, got {type(fn).__name__}")
        if _is_package(known[name], fn):
            return BuildResult("all", False, f"{name}: " + _nudge(known[name]))
    # The appendix's kernel is optional: the course's core is chapters 01-06.
    missing = [name for name, p in known.items() if name not in pieces_by_name and p.chapter != "A1"]
    try:
        details, delegated = run_whole_engine(setup, dict(pieces_by_name))
    except BuildFailure as e:
        return BuildResult("all", False, str(e))
    except PieceError as e:
        return BuildResult("all", False, f"a piece's answer cannot be used: {e}")
    except Exception as e:
        return BuildResult("all", False, _describe_exception(e))
    if delegated:
        return BuildResult("all", False, f"{delegated} call the package's own pieces; write your own")
    message = "the whole engine runs on your pieces and matches the reference engine"
    if missing:
        message += f"; still the package's own: {missing}"
    return BuildResult("all", not missing, message, details)
