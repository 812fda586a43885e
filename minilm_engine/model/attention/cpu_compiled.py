"""The compiled paged decode attention (cpu_paged_decode.cpp): built once per machine, on first use.

Contract: `load()` returns the extension module (function `paged_decode`) or None, and
`unavailable_reason()` says why it is None (no compiler, no `ninja`, a failed build,
MINILM_CPU_MICROKERNEL=0).  Nothing here raises: without it the CPU backend (`cpu.py`) attends
decodes with torch's SDPA over a copy of their blocks.  Built by `model/cpu_build.py`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from minilm_engine.model import cpu_build

SOURCE = Path(__file__).with_name("cpu_paged_decode.cpp")
FUNCTIONS = ("paged_decode",)

_module = None
_reason: str | None = None
_tried = False


def load():
    """The built extension, or None (then `unavailable_reason()` says why); built once per process."""
    global _module, _reason, _tried
    if _tried:
        return _module
    _tried = True
    source = SOURCE.read_text()
    name = cpu_build.build_name("minilm_cpu_paged_decode", source, FUNCTIONS, cpu_build.cpu_flags())
    _module, _reason = cpu_build.build(name, source, FUNCTIONS)
    if _module is None and _reason.startswith("the build failed"):
        warnings.warn(f"CPU paged decode attention: {_reason}; using torch's SDPA", stacklevel=2)
    return _module


def unavailable_reason() -> str | None:
    """None when `load()` gives the extension, else why not (building it if not yet tried)."""
    load()
    return _reason
