"""Tests for minilm_engine.course.machine: the one line that names where a number was measured."""

from __future__ import annotations

import pytest
import torch

from minilm_engine.course.machine import cpu_vector_isa, describe_machine


@pytest.mark.parametrize("flags, expected", [
    ("fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16", "AVX-512+bf16"),
    ("fpu sse2 avx avx2 fma avx512f avx512bw", "AVX-512"),
    ("fpu sse2 avx avx2 fma", "AVX2"),
    ("fpu sse2 avx", "AVX"),
    ("fp asimd evtstrm aes", "NEON"),
])
def test_the_vector_isa_is_read_from_the_cpu_flags(flags, expected):
    assert cpu_vector_isa(flags) == expected


def test_this_machine_is_described_in_one_line():
    line = describe_machine()
    assert "\n" not in line and line
    if not torch.cuda.is_available():
        assert f"{cpu_vector_isa()}, " in line and line.endswith(" cores")
