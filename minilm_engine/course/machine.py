"""What the machine is, for every measurement that names where it ran.

Contract: `describe_machine()` is one line: the GPU, or the CPU model with its vector ISA and
cores; `cpu_vector_isa()` is the widest vector instruction set the CPU offers ("AVX-512",
"AVX2", "NEON", ...).  Timings from two machines are not comparable, so every number the
course records (claims, the ledger, the chapters' HARDWARE lines) carries `describe_machine()`.
"""

from __future__ import annotations

import os
import platform

import torch

from minilm_engine.model.device import cpuinfo_field


def cpu_vector_isa(flags: str | None = None) -> str:
    """The widest vector instruction set the CPU offers, as a name: "AVX-512" (with "+bf16" when
    it has AVX512_BF16), "AVX2", "AVX", "NEON", or "unknown".  `flags` is a cpuinfo flags line
    (for tests); by default this machine's."""
    if flags is None:
        flags = cpuinfo_field("flags", "Features") or ""
    have = set(flags.split())
    if "avx512f" in have:
        return "AVX-512+bf16" if "avx512_bf16" in have else "AVX-512"
    if "avx2" in have:
        return "AVX2"
    if "avx" in have:
        return "AVX"
    if "asimd" in have or "neon" in have or platform.machine() in ("arm64", "aarch64"):
        return "NEON"
    return "unknown"


def describe_machine() -> str:
    """One line naming where a number was measured: the GPU if torch sees one, else the CPU's
    model, its vector ISA and its cores ("AMD EPYC 7B13, AVX2, 2 cores").  Timings from two
    machines are not comparable, so every recorded measurement carries this line."""
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (GPU)"
    name = cpuinfo_field("model name", "Model name") or platform.processor() or platform.machine()
    return f"{name}, {cpu_vector_isa()}, {os.cpu_count()} cores"
