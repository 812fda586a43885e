"""Tests for minilm_engine.model.triton_fused_ops: the fused path's small ops on a GPU.

Each kernel must equal the readable model's ops (decoder.RMSNorm, q/k norm then apply_rotary,
F.silu(gate) * up) to the dtype's rounding, on shapes that are not powers of two (masked
tiles), one row and several; and the decoder fused with them must decode the readable model's
greedy tokens.  Without CUDA the kernels run in the Triton interpreter (conftest.py sets
TRITON_INTERPRET=1 before anything imports triton); with CUDA, natively, and `LLM` picks the
fused GPU path by itself.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # conftest.py did it already, earlier

pytest.importorskip("triton", reason="Triton is not installed (it comes with the 'test' extra on Linux x86-64)")

from minilm_engine import LLM, SamplingParams  # noqa: E402
from minilm_engine.model.attention import triton_paged_prefill  # noqa: E402
from minilm_engine.model.decoder import RMSNorm  # noqa: E402
from minilm_engine.model.fused import FusedAttention, FusedMLP, KernelRMSNorm, fuse_layers  # noqa: E402
from minilm_engine.model.rope import apply_rotary  # noqa: E402
from minilm_engine.model.triton_fused_ops import TRITON_OPS  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cpu" and not triton_paged_prefill.is_interpreted():
    pytest.skip("no GPU, and triton was imported before TRITON_INTERPRET=1 was set (see conftest.py)",
                allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16]


def randn(*shape, dtype, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """To the dtype's rounding.  bf16: within one to two units in the last place of the largest value, since
    Triton's interpreter truncates to bf16 where the GPU rounds to nearest (measured: 31 of 64
    conversions differ), and rotary's sums cancel (a wrong sign or half is off by the values)."""
    if want.dtype == torch.bfloat16:
        torch.testing.assert_close(got, want, rtol=2 ** -6, atol=2 * 2 ** -8 * want.abs().max().item())
    else:
        torch.testing.assert_close(got, want)


def reference_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """decoder.RMSNorm's steps, row r of x by weight[r % H]: x (..., H, D), weight (H, D)."""
    norm = RMSNorm(x.shape[-1], eps).to(DEVICE, x.dtype)
    out = torch.empty_like(x)
    for h in range(weight.shape[0]):
        norm.weight.data.copy_(weight[h])
        out[..., h, :] = norm(x[..., h, :])
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, heads, dim", [(1, 1, 64), (3, 1, 40), (4, 5, 24)])
def test_rms_norm_equals_the_readable_norm(dtype, tokens, heads, dim):
    x, weight = randn(tokens, heads, dim, dtype=dtype), 1 + randn(heads, dim, dtype=dtype, seed=1)
    got = TRITON_OPS.rms_norm(x, weight, 1e-6)
    assert_close(got, reference_norm(x, weight, 1e-6))
    with pytest.raises(ValueError, match="H dividing"):
        TRITON_OPS.rms_norm(x, randn(heads + 1, dim, dtype=dtype), 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_norm", [True, False])
@pytest.mark.parametrize("tokens, heads, dim", [(1, 3, 64), (5, 7, 40)])
def test_norm_rotary_equals_norm_then_rotary_in_place(dtype, with_norm, tokens, heads, dim):
    # A view of a wider row, as the fused qkv output is: the kernel must keep to its heads.
    qkv = randn(tokens, heads + 2, dim, dtype=dtype)
    qk = qkv[:, :heads]
    weight = 1 + randn(heads, dim, dtype=dtype, seed=1) if with_norm else None
    angles = randn(tokens, dim // 2, dtype=torch.float32, seed=2)
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).to(dtype) for f in (torch.cos, torch.sin))
    want = reference_norm(qk, weight, 1e-6) if with_norm else qk.clone()
    want = apply_rotary(want, cos, sin)
    untouched = qkv[:, heads:].clone()
    assert TRITON_OPS.norm_rotary_(qk, weight, 1e-6, cos, sin) is qk
    assert_close(qk, want)
    assert torch.equal(qkv[:, heads:], untouched)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, inner", [(1, 48), (3, 1500)])  # 1500: more than one block of 1024
def test_silu_mul_equals_silu_gate_times_up(dtype, rows, inner):
    x = 3 * randn(rows, 2 * inner, dtype=dtype)
    gate, up = x.split(inner, dim=-1)
    assert_close(TRITON_OPS.silu_mul(x), F.silu(gate) * up)


def test_the_decoder_fused_with_the_kernels_decodes_the_readable_tokens(checkpoints, prompts):
    path = checkpoints["qwen3"].path  # q/k norms, GQA
    args = dict(device=str(DEVICE), record_trace=False, kv_cache_memory=8 << 20)  # CUDA graphs on a GPU
    reference = LLM(path, model_backend="reference", **args)
    fused = LLM(path, model_backend="reference" if DEVICE.type == "cpu" else "fused", **args)
    if DEVICE.type == "cpu":  # on a CPU the fused path picks the micro-kernel: ask for Triton's ops
        with torch.no_grad():
            fuse_layers(fused.model, None, TRITON_OPS)
    layer = fused.model.model.layers[0]
    assert isinstance(layer.self_attn, FusedAttention) and layer.self_attn.ops is TRITON_OPS
    assert isinstance(layer.mlp, FusedMLP) and isinstance(layer.input_layernorm, KernelRMSNorm)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = reference.generate(prompts[:3], greedy, use_tqdm=False)
    got = fused.generate(prompts[:3], greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
