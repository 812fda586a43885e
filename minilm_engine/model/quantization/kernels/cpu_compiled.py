"""The compiled CPU micro-kernel (cpu_microkernel.cpp): built once per machine, on first use.

Contract: `load()` returns the extension module (`packed_mm` for fp32 / bf16 weights packed in
tiles, `int8_mm`, `int4_mm`, the fused path's `rms_norm`, `norm_rotary_` and `silu_mul`,
`vector_width`, `bf16_dot`) or None, and `unavailable_reason()` says why (model/cpu_build.py); nothing here
raises: without it the callers run torch's operators, with the same results to float rounding.
"""

from __future__ import annotations

from pathlib import Path

from minilm_engine.model import cpu_build
from minilm_engine.model.cpu_build import ENV_SWITCH

__all__ = ["ENV_SWITCH", "FUNCTIONS", "SOURCE", "EXTENSION", "build_name", "load", "unavailable_reason"]

SOURCE = Path(__file__).with_name("cpu_microkernel.cpp")
FUNCTIONS = ("packed_mm", "int8_mm", "int4_mm", "rms_norm", "norm_rotary_", "silu_mul", "vector_width", "bf16_dot")  # what the module exports


def _cpu_flags() -> str:
    return cpu_build.cpu_flags()


EXTENSION = cpu_build.Extension("minilm_cpu_microkernel", SOURCE, FUNCTIONS, "CPU micro-kernel", "torch's operators",
                                flags=lambda: _cpu_flags())  # late-bound: tests replace _cpu_flags
build_name = EXTENSION.name
load = EXTENSION.load  # the module or None; built once per process, later calls return the same
unavailable_reason = EXTENSION.unavailable_reason
