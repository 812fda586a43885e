"""The compiled CPU micro-kernel (cpu_microkernel.cpp): built once per machine, on first use.

Contract: `load()` returns the extension module (functions `dense_mm` for fp32 / bf16
weights, `int8_mm`, `int4_mm`, `vector_width`) or None, and `unavailable_reason()` says why it is None: no C++ compiler,
no `ninja`, a failed build, or MINILM_CPU_MICROKERNEL=0.  Nothing here raises: a machine that
cannot build the kernel runs torch's own operators instead (kernels/cpu.py), with the same
results up to float rounding.

Built with `torch.utils.cpp_extension.load` and `-O3 -march=native`, so the code is the best
this CPU's vector units allow (AVX2, AVX-512 or NEON) and is rebuilt where another CPU or
another source is met: torch caches builds under ~/.cache/torch_extensions keyed by the
source, and the build name below carries the CPU's flags so two CPUs sharing a home never
load each other's build.  The first build takes about a minute.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import warnings
from pathlib import Path

from minilm_engine.model.device import cpuinfo_field

SOURCE = Path(__file__).with_name("cpu_microkernel.cpp")
ENV_SWITCH = "MINILM_CPU_MICROKERNEL"  # "0": never build, use torch's operators
FUNCTIONS = ("dense_mm", "int8_mm", "int4_mm", "vector_width")  # what the module exports

_module = None
_reason: str | None = None
_tried = False


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux), or the platform's name elsewhere."""
    return cpuinfo_field("flags", "Features") or platform.processor() or platform.machine()


def build_name() -> str:
    """The extension's name: one per (CPU flags, source, exported functions), as -march=native
    code must be."""
    digest = hashlib.sha256((_cpu_flags() + SOURCE.read_text() + " ".join(FUNCTIONS)).encode()).hexdigest()[:12]
    return f"minilm_cpu_microkernel_{digest}"


def _missing_tool() -> str | None:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"{ENV_SWITCH}=0"
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler (c++) on PATH"
    try:
        from torch.utils.cpp_extension import is_ninja_available
    except ImportError as e:  # pragma: no cover - every torch we support has it
        return f"torch.utils.cpp_extension does not import ({e})"
    if not is_ninja_available():
        return "`ninja` is not installed (pip install ninja)"
    return None


def load():
    """The built extension, or None (then `unavailable_reason()` says why).  Builds once per
    process; later calls return the same module."""
    global _module, _reason, _tried
    if _tried:
        return _module
    _tried = True
    _reason = _missing_tool()
    if _reason is not None:
        return None
    try:
        from torch.utils.cpp_extension import load_inline

        _module = load_inline(
            name=build_name(),
            cpp_sources=[SOURCE.read_text()],
            functions=list(FUNCTIONS),
            extra_cflags=["-O3", "-march=native", "-fopenmp"],  # OpenMP: at::parallel_for's threads
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as e:  # a compiler error must not stop a model from loading
        _reason = f"the build failed ({type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''})"
        warnings.warn(f"CPU micro-kernel: {_reason}; using torch's operators", stacklevel=2)
        _module = None
    return _module


def unavailable_reason() -> str | None:
    """None when `load()` gives the extension, else why not (building it if not yet tried)."""
    load()
    return _reason
