"""The compiled CPU micro-kernel (cpu_microkernel.cpp): built once per machine, on first use.

Contract: `load()` returns the extension module (functions `dense_mm` for fp32 / bf16
weights, `int8_mm`, `int4_mm`, `vector_width`) or None, and `unavailable_reason()` says why it is None: no C++ compiler,
no `ninja`, a failed build, or MINILM_CPU_MICROKERNEL=0.  Nothing here raises: a machine that
cannot build the kernel runs torch's own operators instead (kernels/cpu.py), with the same
results up to float rounding.

Built by `model/cpu_build.py` (`-O3 -march=native`, or `$MINILM_CPU_MARCH`), so the code is the
best this CPU's vector units allow (AVX2, AVX-512 or NEON) and is rebuilt where another CPU or
another source is met.  The first build takes about a minute.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from minilm_engine.model import cpu_build
from minilm_engine.model.cpu_build import ENV_SWITCH

__all__ = ["ENV_SWITCH", "FUNCTIONS", "SOURCE", "build_name", "load", "unavailable_reason"]

SOURCE = Path(__file__).with_name("cpu_microkernel.cpp")
FUNCTIONS = ("dense_mm", "int8_mm", "int4_mm", "vector_width")  # what the module exports

_module = None
_reason: str | None = None
_tried = False


def _cpu_flags() -> str:
    return cpu_build.cpu_flags()


def build_name() -> str:
    """The extension's name: one per (CPU flags, -march, source, exported functions)."""
    return cpu_build.build_name("minilm_cpu_microkernel", SOURCE.read_text(), FUNCTIONS, _cpu_flags())


def load():
    """The built extension, or None (then `unavailable_reason()` says why).  Builds once per
    process; later calls return the same module."""
    global _module, _reason, _tried
    if _tried:
        return _module
    _tried = True
    _module, _reason = cpu_build.build(build_name(), SOURCE.read_text(), FUNCTIONS)
    if _module is None and _reason.startswith("the build failed"):
        warnings.warn(f"CPU micro-kernel: {_reason}; using torch's operators", stacklevel=2)
    return _module


def unavailable_reason() -> str | None:
    """None when `load()` gives the extension, else why not (building it if not yet tried)."""
    load()
    return _reason
