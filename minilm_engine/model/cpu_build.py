"""Building the model's C++ CPU kernels: once per machine, on first use, never fatal.

Contract: `Extension(prefix, source, functions, ...)` compiles one C++ source with
`torch.utils.cpp_extension.load_inline` on its first `load()` and returns the module, or None
with `unavailable_reason()` saying why (no C++ compiler, no `ninja`, a failed build, or
`MINILM_CPU_MICROKERNEL=0`); callers fall back to torch's operators.  Built with `-O3
-march=native` (or `$MINILM_CPU_MARCH`, e.g. `haswell` for the AVX2 code on an AVX-512 machine),
under a name carrying the CPU's flags, the -march, the source and the torch it links against,
so two CPUs (or two venvs) sharing a home never load, or rebuild, each other's build.  A first
build takes a minute or two.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import warnings

from minilm_engine.model.device import cpuinfo_field

ENV_SWITCH = "MINILM_CPU_MICROKERNEL"  # "0": never build, use torch's operators
MARCH_ENV = "MINILM_CPU_MARCH"  # the -march to build for; "native" when unset


def cpu_flags() -> str:
    """The CPU's feature flags (Linux), or the platform's name elsewhere."""
    return cpuinfo_field("flags", "Features") or platform.processor() or platform.machine()


def march() -> str:
    return os.environ.get(MARCH_ENV, "native")


def torch_install() -> str:
    """Which torch a build links against: its version and where it is installed.  torch keeps one
    build folder per name and rebuilds when the command changes, and the command holds torch's
    include path: two venvs building under one name would rebuild each other's every time."""
    import torch

    return f"{torch.__version__} {os.path.dirname(torch.__file__)}"


def build_name(prefix: str, source: str, functions: tuple[str, ...], flags: str) -> str:
    """One name per (CPU flags, -march, torch, source, exported functions), as -march=native code
    and a torch extension must be."""
    key = flags + march() + torch_install() + source + " ".join(functions)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return f"{prefix}_{digest}"


def missing_tool() -> str | None:
    """Why nothing can be built here, or None."""
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


def build(name: str, source: str, functions: tuple[str, ...]):
    """(module, None) or (None, why not): compiles `source` as extension `name` (see the module doc)."""
    reason = missing_tool()
    if reason is not None:
        return None, reason
    try:
        from torch.utils.cpp_extension import load_inline

        module = load_inline(
            name=name,
            cpp_sources=[source],
            functions=list(functions),
            extra_cflags=["-O3", f"-march={march()}", "-fopenmp"],  # OpenMP: at::parallel_for's threads
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as e:  # a compiler error must not stop a model from loading
        text = str(e).strip()
        return None, f"the build failed ({type(e).__name__}: {text.splitlines()[-1] if text else ''})"
    return module, None


def read_source(path) -> str:
    """The C++ source at `path`, each `#include "file"` line (a path relative to `path`'s folder)
    replaced by that file's text: `load_inline` compiles one string, and the build name hashes
    this text, so a shared header's change rebuilds the kernels that include it."""
    lines = []
    for line in path.read_text().splitlines(keepends=True):
        match = re.match(r'\s*#include "([^"]+)"', line)
        if match is None:
            lines.append(line)
            continue
        included = path.parent / match.group(1)
        lines.append(f"// ---- {match.group(1)}, pasted by cpu_build.read_source\n{read_source(included)}\n")
    return "".join(lines)


class Extension:
    """One compiled module, built at most once per process on first `load()`.  A failed build
    warns once, naming what runs instead (`fallback`); a missing tool or the switch set to "0"
    is silent (choices, not errors)."""

    def __init__(self, prefix: str, source_path, functions: tuple[str, ...], what: str, fallback: str,
                 flags=cpu_flags):
        self.prefix, self.source_path, self.functions = prefix, source_path, functions
        self.what, self.fallback, self.flags = what, fallback, flags
        self.module, self.reason, self.tried = None, None, False

    def name(self) -> str:
        """The extension's name: one per (CPU flags, -march, torch, source, exported functions)."""
        return build_name(self.prefix, read_source(self.source_path), self.functions, self.flags())

    def load(self):
        if self.tried:
            return self.module
        self.tried = True
        self.module, self.reason = build(self.name(), read_source(self.source_path), self.functions)
        if self.module is None and self.reason.startswith("the build failed"):
            warnings.warn(f"{self.what}: {self.reason}; using {self.fallback}", stacklevel=2)
        return self.module

    def unavailable_reason(self) -> str | None:
        """None when `load()` gives the module, else why not (building it if not yet tried)."""
        self.load()
        return self.reason
