"""The appendix's build piece: the online softmax of the paged decode kernel, in Triton.

Contract: the learner writes a `@triton.jit` kernel with `paged_decode_kernel`'s signature
(`model/attention/triton_paged_decode.py`; A1 gives its shell, the block-table gather done, and asks
for the online-softmax accumulation and the final normalisation).  The checker launches it in
the engine (the Triton attention backend, under `TRITON_INTERPRET=1` on a CPU) for every decode
step, and compares greedy tokens with the package's engine on the torch reference.
"""

from __future__ import annotations

from typing import Any

from minilm_engine.model.attention.backends import triton_unavailable_reason
from minilm_engine.course.teaching.build import BuildFailure, Piece, PieceError, register_piece
from minilm_engine.course.teaching.build_runs import (
    BuildSetup,
    reference_run,
    require_same_tokens,
    run_engine,
)
from minilm_engine.course.teaching.build_pieces import _ADAPTERS, _calls, _with

KERNEL_ARGS = {"block_size": 4, "num_kv_blocks": 64, "max_num_seqs": 5}


def _adapt_decode_kernel(kernel: Any):
    def call():
        return kernel

    return call


def _triton_kernel(fn: Any) -> Any:
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        raise BuildFailure("Triton is not installed (`pip install triton`)") from None
    if not isinstance(fn, (JITFunction, InterpretedFunction)):
        raise PieceError(f"expected a @triton.jit kernel, got {type(fn).__name__}: decorate your function with @triton.jit")
    from minilm_engine.model.attention import triton_paged_decode

    return fn is triton_paged_decode.paged_decode_kernel


def _check_decode_kernel(fn: Any, setup: BuildSetup) -> list[str]:
    import torch

    if _triton_kernel(fn):
        raise BuildFailure(
            "that is the package's own paged_decode_kernel: it works, of course, but the exercise is to "
            "write the online softmax yourself"
        )
    reason = triton_unavailable_reason(torch.device("cpu"), torch.float32)
    if reason is not None and not torch.cuda.is_available():
        raise BuildFailure(f"the Triton kernels cannot run here: {reason}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = dict(KERNEL_ARGS, attention_backend="triton", device=device)
    want = reference_run(setup, {**KERNEL_ARGS, "attention_backend": "torch", "device": device})
    got = _with("attention.decode_kernel", fn, lambda: run_engine(setup, args))
    return [require_same_tokens(got, want, setup) + " (the reference on the torch attention)",
            _calls("attention.decode_kernel")]


_ADAPTERS["attention.decode_kernel"] = _adapt_decode_kernel
register_piece(
    Piece(
        name="decode_kernel",
        registry_name="attention.decode_kernel",
        chapter="A1",
        signature=(
            "@triton.jit\n"
            "def my_decode_kernel(<paged_decode_kernel's parameters>)\n"
            "  A1 gives the shell (the query tile, the block-table gather of each key tile); write the\n"
            "  running softmax over the key tiles and the final normalised store"
        ),
        hint=(
            "you never hold all the scores at once: keep, per query row, the largest score so far, the "
            "sum of exponentials measured against it, and the weighted sum of values; when a tile "
            "brings a larger score, what you summed so far was measured against the wrong maximum."
        ),
        adapt=_adapt_decode_kernel,
        run_check=_check_decode_kernel,
        solutions="A1_triton_paged_attention_solutions.ipynb",
    )
)
