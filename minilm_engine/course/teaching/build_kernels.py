"""The appendix's build piece: the online softmax of the paged decode kernel, in Triton.

Contract: the learner writes a `@triton.jit` kernel with `paged_decode_kernel`'s signature
(`model/attention/triton_paged_decode.py`; A1 gives its shell, the block-table gather done, and asks
for the online-softmax accumulation and the final normalisation).  The checker launches it in
the engine (the Triton attention backend, under `TRITON_INTERPRET=1` on a CPU) for every decode
step, and compares greedy tokens with the package's engine on the torch reference.  Before the
engine, `check_kernel_alone` launches it on a random paged batch (several K/V heads, contexts
inside one key tile and across several) against `paged_attention_reference`, in seconds, and
names the usual mistakes: an output never written (the checker fills it with NaN first), the
rescale forgotten, the wrong K/V head, a wrong stride or mask (rows outside the context read).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
from minilm_engine.course.teaching.build_units import kv_heads_read, require_gqa_mapping

# fp32 on every device: on a GPU the engine defaults to bf16, where the Triton prefill and the
# torch reference round differently and a small random model's near-equal logits can swap the
# first token (seen on an H200) although both attentions are right.
KERNEL_ARGS = {"block_size": 4, "num_kv_blocks": 64, "max_num_seqs": 5, "dtype": "float32"}


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


def _paged_batch(gen, device) -> tuple[Any, Any, Any, Any]:
    """A random paged decode batch: 8 query heads over 2 K/V heads, context lengths inside one key
    tile, exactly one tile and over several (16 keys a tile), blocks of 4 scattered in the pool;
    the later keys lean towards the query, so the running maximum rises from tile to tile."""
    import torch

    from minilm_engine.model.attention.paged import PagedAttentionMetadata

    context_lens = [3, 16, 21, 37]
    H, H_kv, D, block_size, num_blocks = 8, 2, 8, 4, 40
    q = torch.randn(len(context_lens), H, D, generator=gen)
    k_cache = torch.randn(num_blocks, block_size, H_kv, D, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, H_kv, D, generator=gen)
    order = torch.randperm(num_blocks, generator=gen)
    max_blocks = -(-max(context_lens) // block_size)
    tables = torch.zeros(len(context_lens), max_blocks, dtype=torch.int64)
    used = 0
    for i, n in enumerate(context_lens):
        num = -(-n // block_size)
        tables[i, :num] = order[used : used + num]
        used += num
        for pos in range(n):  # keys grow more aligned with the query heads' mean along the context
            block, row = int(tables[i, pos // block_size]), pos % block_size
            k_cache[block, row] += (pos / n) * 1.5 * q[i].view(H_kv, H // H_kv, D).mean(1)
    last = torch.tensor([int(tables[i, (n - 1) // block_size]) * block_size + (n - 1) % block_size
                         for i, n in enumerate(context_lens)])
    meta = PagedAttentionMetadata(slot_mapping=last.to(device),
                                  query_start_loc=torch.arange(len(context_lens) + 1, device=device),
                                  context_lens=torch.tensor(context_lens, device=device),
                                  block_tables=tables.to(device))
    return q.to(device), k_cache.to(device), v_cache.to(device), meta


def check_kernel_alone(fn: Any) -> str:
    """The learner's kernel launched directly (no model) on a random paged batch, against the
    torch reference; the usual mistakes named."""
    import torch

    from minilm_engine.model.attention.paged import paged_attention_reference
    from minilm_engine.model.attention.triton_paged_decode import BLOCK_N, paged_decode_attention

    # As the engine run: on a GPU where there is one (a compiled kernel reads GPU memory).
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    q, k_cache, v_cache, meta = _paged_batch(torch.Generator().manual_seed(11), device)
    want = paged_attention_reference(q, k_cache, v_cache, meta)
    with _with_kernel(fn), _nan_filled_outputs():
        got = paged_decode_attention(q, k_cache, v_cache, meta).clone()
        probe = paged_decode_attention(q, *_probe_cache(k_cache, meta), meta).cpu()
    got, want = got.cpu(), want.cpu()
    where = f"alone, a random paged batch of {meta.num_seqs} sequences (context lengths {meta.context_lens.tolist()})"
    if torch.count_nonzero(got) == 0:
        raise BuildFailure(f"{where}: your kernel's output is all zeros: normalise the running sum of values by "
                           f"the running sum of exponentials and store it into out_ptr")
    if torch.isnan(got).all():
        raise BuildFailure(f"{where}: your kernel never wrote its output (out_ptr still holds the NaN the checker "
                           f"filled it with): tl.store the normalised rows at seq * stride_out_token + head * "
                           f"stride_out_head + dims")
    if not torch.isfinite(got).all():
        bad = sorted({int(i) for i in torch.nonzero(~torch.isfinite(got))[:, 1]})
        raise BuildFailure(f"{where}: your kernel's output has NaN or inf (query heads {bad}): is every row stored "
                           f"(the checker filled the output with NaN first), and never exp(-inf - (-inf)) (start "
                           f"the running maximum at -inf and only rescale by finite differences)?")
    read = kv_heads_read(probe, k_cache.shape[2])
    require_gqa_mapping(read, k_cache.shape[2], where)
    if None in read:
        raise BuildFailure(
            f"{where}: query head {read.index(None)} read cache rows outside its sequence's context (with all keys "
            f"equal and the values of the rows it should read equal to their K/V head's number, its output is not "
            f"that number): a wrong stride, or a missing mask. A cached row is at block * stride_cache_block + "
            f"(pos % block_size) * stride_cache_row + kv_head * stride_cache_head, with block read from the "
            f"sequence's block table at seq * stride_table_seq + pos // block_size, and only pos < context_len"
        )
    close = [torch.allclose(got[i], want[i], rtol=1e-4, atol=1e-4) for i in range(meta.num_seqs)]
    if all(close):
        return f"{where}: matches the reference attention"
    lens = meta.context_lens.tolist()
    if all(ok for ok, n in zip(close, lens) if n <= BLOCK_N):
        bad = [n for ok, n in zip(close, lens) if not ok]
        raise BuildFailure(
            f"{where}: the sequences that fit in one key tile ({BLOCK_N} keys) are right, those of {bad} keys are "
            f"not: when a tile brings a larger maximum, the sums kept so far were measured against the old one and "
            f"must be rescaled by exp(m_old - m_new)"
        )
    i = close.index(False)
    h = int((got[i] - want[i]).abs().amax(-1).argmax())
    raise BuildFailure(
        f"{where}: sequence {i} ({lens[i]} keys), query head {h}: your output differs from the reference attention "
        f"by {(got[i, h] - want[i, h]).abs().max().item():.3g} (check the strides of the loads and the store, "
        f"and the scale 1/sqrt(D))"
    )


def _probe_cache(k_cache: Any, meta: Any) -> tuple[Any, Any]:
    """Keys all zero (every score equal: the softmax is a plain mean, whatever the rescale), and
    values j + 1 on K/V head j in the rows a sequence should read (its blocks, before its
    context length), 1000 everywhere else: the mean is j + 1 only if the kernel read exactly
    its own rows of the right head."""
    import torch

    num_blocks, block_size, H_kv, D = k_cache.shape
    v = torch.full((num_blocks * block_size, H_kv, D), 1000.0)
    heads = (torch.arange(H_kv, dtype=torch.float32) + 1)[:, None].expand(H_kv, D)
    tables, lens = meta.block_tables.cpu(), meta.context_lens.cpu()
    for i, n in enumerate(lens.tolist()):
        for pos in range(n):
            v[int(tables[i, pos // block_size]) * block_size + pos % block_size] = heads
    return torch.zeros_like(k_cache), v.view(num_blocks, block_size, H_kv, D).to(k_cache.device)


@contextmanager
def _nan_filled_outputs() -> Iterator[None]:
    """`paged_decode_attention` allocates its output with torch.empty, whose contents are whatever
    the memory held (possibly a right answer from before): fill it with NaN instead, so an output
    the kernel never writes shows."""
    import torch

    from minilm_engine.model.attention import triton_paged_decode

    class _Torch:
        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

        @staticmethod
        def empty(*args: Any, **kwargs: Any) -> Any:
            return torch.empty(*args, **kwargs).fill_(float("nan"))

    original = triton_paged_decode.torch
    triton_paged_decode.torch = _Torch()
    try:
        yield
    finally:
        triton_paged_decode.torch = original


def kernel_source_without_the_exercise() -> str:
    """`paged_decode_kernel`'s source with what A1's build exercise asks for left out (the running
    values' start, step 2c's online softmax, step 3's normalisation), so the chapter can show the
    kernel's shape before the learner writes those lines."""
    import inspect

    from minilm_engine.model.attention.triton_paged_decode import paged_decode_kernel

    lines, kept, skipping = inspect.getsource(paged_decode_kernel.fn).splitlines(), [], False
    in_step_2_comment = False
    for line in lines:
        text = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if text.startswith("# 2. Online softmax"):  # (its comment states the recipe: left out)
            in_step_2_comment = True
            kept.append(indent + "# 2. Online softmax over the keys, one tile of BLOCK_N positions at a time.")
            continue
        if in_step_2_comment and text.startswith("#"):
            continue
        in_step_2_comment = False
        if text.startswith(("m = tl.full", "l = tl.zeros")):
            if not text.startswith("m ="):
                continue
            line = line[: len(line) - len(line.lstrip())] + "# ... the running values beside acc: the build exercise"
        elif text.startswith("# 2c."):
            skipping = True
            kept.append(line[: len(line) - len(line.lstrip())] + "# 2c. ... fold the tile into the running softmax: "
                        "the build exercise")
            continue
        elif skipping and text.startswith("m = m_new"):
            skipping = False
            continue
        elif text.startswith("out = acc /"):
            line = line[: len(line) - len(line.lstrip())] + "out = ...  # normalise: the build exercise"
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


def _with_kernel(fn: Any):
    from minilm_engine import pluggable

    return pluggable.override("attention.decode_kernel", _adapt_decode_kernel(fn))


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
    alone = check_kernel_alone(fn)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = dict(KERNEL_ARGS, attention_backend="triton", device=device)
    want = reference_run(setup, {**KERNEL_ARGS, "attention_backend": "torch", "device": device})
    got = _with("attention.decode_kernel", fn, lambda: run_engine(setup, args))
    return [alone, require_same_tokens(got, want, setup) + " (the reference on the torch attention)",
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
