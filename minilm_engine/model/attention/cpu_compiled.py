"""The compiled paged decode attention (cpu_paged_decode.cpp): built once per machine, on first use.

Contract: `load()` returns the extension module (functions `paged_decode`, `write_kv`) or None, and
`unavailable_reason()` says why it is None (no compiler, no `ninja`, a failed build,
MINILM_CPU_MICROKERNEL=0).  Nothing here raises: without it the CPU backend (`cpu.py`) attends
decodes with torch's SDPA over a copy of their blocks.  Built by `model/cpu_build.py`.
"""

from __future__ import annotations

from pathlib import Path

from minilm_engine.model import cpu_build

SOURCE = Path(__file__).with_name("cpu_paged_decode.cpp")
FUNCTIONS = ("paged_decode", "write_kv")

EXTENSION = cpu_build.Extension("minilm_cpu_paged_decode", SOURCE, FUNCTIONS, "CPU paged decode attention",
                                "torch's SDPA")
load = EXTENSION.load  # the module or None; built once per process
unavailable_reason = EXTENSION.unavailable_reason
