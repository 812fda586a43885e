"""The "Your turn" exercise of appendix A1 (the Triton paged decode kernel).

`decode_kv_bytes_exercise`: how many bytes of keys and values one decode step reads in one
layer.  Its reference is the measuring code's own `experiments.kernel_stats.decode_kv_bytes`;
the random cases mix dtypes (fp8 included) and GQA ratios, so that counting query heads instead
of K/V heads, or forgetting the values, fails.
"""

from __future__ import annotations

import random

import torch

from ..experiments.kernel_stats import decode_kv_bytes
from .exercises import Exercise

EXERCISE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn)


def _decode_bytes_case(rng: random.Random) -> dict:
    return {
        "num_seqs": rng.randint(1, 256),
        "context_len": rng.randint(1, 32768),
        "num_kv_heads": rng.choice([1, 2, 4, 8]),
        "head_dim": rng.choice([64, 128, 256]),
        "dtype": rng.choice(EXERCISE_DTYPES),
    }


decode_kv_bytes_exercise = Exercise(
    "decode_kv_bytes",
    decode_kv_bytes,
    _decode_bytes_case,
    hint=(
        "Each (sequence, K/V head) program reads context_len keys and context_len values of "
        "head_dim elements; dtype.itemsize gives the bytes of one element."
    ),
)
