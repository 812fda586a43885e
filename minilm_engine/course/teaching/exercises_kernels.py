"""Appendix A1's exercise: the bytes of keys and values one decode step reads.

    decode_kv_bytes_exercise   my_decode_kv_bytes(num_seqs, context_len, num_heads, num_kv_heads,
                               head_dim, dtype) against cases answered by the package's
                               `decode_kv_bytes` (course/experiments/kernel_stats.py)

The function is given the number of query heads too, because that is the trap the hint names:
in grouped-query attention the query heads of a group share one read of their K/V head, so
`num_heads` must not appear in the answer.  The cases mix GQA ratios from 1 (multi-head) to 8,
and four dtypes (fp8 included), so using query heads, or a fixed 2 bytes, fails.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from minilm_engine.course.teaching.exercises import Exercise

EXERCISE_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn")


def make_decode_bytes_case(rng: random.Random) -> dict[str, Any]:
    num_kv_heads = rng.choice([1, 2, 4, 8])
    return {
        "num_seqs": rng.randint(1, 256),
        "context_len": rng.randint(1, 32768),
        "num_heads": num_kv_heads * rng.choice([1, 2, 4, 8]),
        "num_kv_heads": num_kv_heads,
        "head_dim": rng.choice([64, 128, 256]),
        "dtype": rng.choice(EXERCISE_DTYPES),
    }


def decode_dtype(raw: dict[str, Any]) -> dict[str, Any]:
    """Stored cases name the dtype ("bfloat16"); the function receives a `torch.dtype`."""
    return {**raw, "dtype": getattr(torch, raw["dtype"])}


decode_kv_bytes_exercise = Exercise(
    "decode_kv_bytes",
    "decode_kv_bytes",
    decode=decode_dtype,
    hint=(
        "Each (sequence, K/V head) program reads context_len keys and context_len values of "
        "head_dim elements; dtype.itemsize gives the bytes of one element. The query heads of a "
        "group all use the K/V their program loaded once: does num_heads change the bytes read?"
    ),
    shows=("minilm_engine.course.experiments.kernel_stats:decode_kv_bytes",),
    solutions="A1_triton_paged_attention_solutions.ipynb",
)
