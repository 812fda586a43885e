"""The fast path: the decoder's layers with fewer, faster ops, beside the readable decoder.

Contract: `apply_model_backend(model, "fused")` swaps, in every layer of a loaded `CausalLM`,
the attention and the MLP for modules doing the same math (equal to float rounding, greedy
tokens equal), and the norms (and, on a CPU, the head) for kernel-backed ones;
`model/decoder.py` is untouched and `"reference"` leaves the model as it is.  On a CPU the
kernels are the compiled micro-kernel's (quantization/kernels/cpu_microkernel.cpp; without it,
it says why once and runs torch's ops); on a CUDA GPU the small ops are Triton kernels
(`model/triton_fused_ops.py`) and the matmuls cuBLAS's over the concatenated weights.  Where
the path cannot run (another device, no Triton on the GPU, a dtype other than fp32 / bf16 on
the CPU) it warns with the reason and keeps the readable model.
`resolve_model_backend(None)` reads `$MINILM_MODEL_BACKEND` ("fused" when unset; a default that
cannot run falls back quietly).

    readable (decoder.py)                       fused (this file)
    x ─ q_proj, k_proj, v_proj ─ q, k, v        x ─ qkv_proj (one matmul) ─ q, k, v
    q_norm(q), k_norm(k), rotary(q), rotary(k)  norm_rotary_(q and k): one kernel call, in place
    down(silu(gate(x)) * up(x))                 down(silu_mul(gate_up(x))): one matmul, one call
    RMSNorm: ~8 torch ops                       rms_norm: one kernel call
    every matmul: F.linear                      CPU: the micro-kernel's packed_mm on weights
                                                repacked once in tiles of 16 rows
                                                (kernels/cpu_dense.py); GPU: F.linear
    embed_tokens: nn.Embedding                  CPU: a tied table's rows read back from the
                                                head's packed copy (one table)

Why: a decode step should cost one read of the weights, and at a few rows each small op costs
its dispatch (a GPU kernel launch), not its arithmetic.  Quantized projections stay `QuantizedLinear`s under their
checkpoint names, grouped by input (`QuantizedGroup`).  Without the micro-kernel bf16 weights
are packed for oneDNN instead.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from minilm_engine.model.device import native_bf16_matmul
from minilm_engine.model.decoder import MLP, Attention, CausalLM, rms_norm
from minilm_engine.model.quantization.kernels import cpu_compiled
from minilm_engine.model.quantization.kernels.cpu_dense import PackedMatmul
from minilm_engine.model.quantization.linear import QuantizedLinear
from minilm_engine.model.rope import apply_rotary

MODEL_BACKENDS = ("reference", "fused")
BACKEND_ENV = "MINILM_MODEL_BACKEND"
DEFAULT_MODEL_BACKEND = "fused"  # where it cannot run, it falls back quietly (see the module doc)
PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
# The GPU path's kernels pass their tests under the Triton interpreter but have not yet run on a
# card (the GPU lent on 2026-12-04 was gone before they were written): on a GPU the default keeps
# the readable model and "fused" runs them when asked for by name.  A GPU session that sees
# `scripts/gpu_check.sh` pass with them (tests/test_triton_fused_ops.py, benchmarks/gpu_decode.py)
# turns this on.
FUSED_GPU_BY_DEFAULT = False


class FusedLinear(nn.Module):
    """y = x W^T + b for `nn.Linear`s of the same input, their outputs side by side, as one
    matmul (inference only), over one copy of the weight.  With the micro-kernel (`micro`): the
    weight packed for it (`PackedMatmul`).  Without it: bf16 packed for oneDNN (opaque;
    `onednn_packed`), fp32 plain for `F.linear` (packing was ~7% slower there).
    `num_weight_bytes` (bias included) is for `LLM.weight_bytes`."""

    def __init__(self, linears: list[nn.Linear], micro=None):
        super().__init__()
        weight = torch.cat([lin.weight.detach() for lin in linears]).contiguous()  # (sum of out, in)
        biases = [lin.bias for lin in linears]
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        self.num_weight_bytes = sum(t.numel() * t.element_size() for t in (weight, self.bias) if t is not None)
        self.onednn_packed = micro is None and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
        self.matmul = None if micro is None else PackedMatmul(weight, self.bias, micro)
        if self.matmul is not None:
            self.weight = None  # the packed tiles are the one copy
        else:  # packed for one row (decode); measured as fast as any other hint at 4, 16 and 512 rows
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1) if self.onednn_packed else weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.matmul is not None:
            return self.matmul(x)
        if self.onednn_packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class QuantizedGroup(nn.Module):
    """`QuantizedLinear`s of the same input, their outputs side by side (each on its own kernel,
    so the readable quantized model's bits).  Held in a plain list: the fused modules register
    them under their checkpoint names, so state_dict names and `weight_bytes` stay."""

    def __init__(self, linears: list[nn.Module]):
        super().__init__()
        self.linears = list(linears)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([linear(x) for linear in self.linears], dim=-1)


def quantized(linears: list[nn.Module]) -> bool:
    return any(isinstance(linear, QuantizedLinear) for linear in linears)


class HeadwiseRMSNorm(nn.Module):
    """Several `decoder.RMSNorm`s of one size applied at once, one per head: x (..., heads, D)
    -> head h normalised with norms[h]'s weight, by `decoder.RMSNorm`'s steps (the same bits)."""

    def __init__(self, norms: list):
        super().__init__()
        eps = {norm.eps for norm in norms}
        if len(eps) != 1:
            raise ValueError(f"the norms have different eps {sorted(eps)}: they cannot run as one")
        self.eps = eps.pop()
        weight = torch.stack([norm.weight.detach() for norm in norms])  # (heads, D)
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)  # weight (heads, D) broadcasts over x's heads


class KernelRMSNorm(nn.Module):
    """`decoder.RMSNorm` in one call of `ops.rms_norm` (the micro-kernel's or Triton's: the same
    steps, the sum of squares in another order).  It holds the norm's own Parameter, so state_dict names stay."""

    def __init__(self, norm: nn.Module, ops):
        super().__init__()
        self.weight, self.eps, self.ops = norm.weight, norm.eps, ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x.contiguous(), self.weight.detach(), self.eps)


class FusedAttention(nn.Module):
    """`decoder.Attention` with q, k and v from one matmul (on the micro-kernel `micro` when
    given), and q and k normalised and rotated together (with `ops`, the micro-kernel or
    `TRITON_OPS`: its `norm_rotary_`, in place on the matmul's output; without, torch's ops, the
    readable model's arithmetic on every element)."""

    def __init__(self, attn: Attention, micro=None, ops=None):
        super().__init__()
        self.layer_idx, self.ops = attn.layer_idx, ops
        self.num_heads, self.num_kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        if quantized([attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]):  # kept, under their names
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
            self.qkv_proj = QuantizedGroup([attn.q_proj, attn.k_proj, attn.v_proj])
        else:
            self.qkv_proj = FusedLinear([attn.q_proj, attn.k_proj, attn.v_proj], micro)
            self.o_proj = FusedLinear([attn.o_proj], micro)
        self.qk_dim = (self.num_heads + self.num_kv_heads) * self.head_dim  # q and k, side by side
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        # Kept as the checkpoint's weights (`LLM.weight_bytes` counts them); the step runs
        # their per-head expansion, `qk_norm`.
        if q_norm is not None:
            self.q_norm, self.k_norm = q_norm, k_norm
        self.qk_norm = None if q_norm is None else HeadwiseRMSNorm(
            [q_norm] * self.num_heads + [k_norm] * self.num_kv_heads)

    def forward(self, x, cos, sin, attn) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)  # (N, (H + 2 H_kv) D)
        qk = qkv[:, : self.qk_dim].view(num_tokens, -1, self.head_dim)  # (N, H + H_kv, D)
        v = qkv[:, self.qk_dim :].view(num_tokens, self.num_kv_heads, self.head_dim)  # (N, H_kv, D)
        if self.ops is not None:
            norm = None if self.qk_norm is None else self.qk_norm.weight
            self.ops.norm_rotary_(qk, norm, 0.0 if norm is None else self.qk_norm.eps, cos, sin)
        else:
            if self.qk_norm is not None:
                qk = self.qk_norm(qk)
            qk = apply_rotary(qk, cos, sin)  # (N, H + H_kv, D)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        out = attn.attend(self.layer_idx, q, k, v)  # (N, H, D)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class FusedMLP(nn.Module):
    """`decoder.MLP` (SwiGLU) with gate and up from one matmul (on the micro-kernel `micro` when
    given), and `ops.silu_mul` after it when there are `ops`."""

    def __init__(self, mlp: MLP, micro=None, ops=None):
        super().__init__()
        self.intermediate_size, self.ops = mlp.gate_proj.out_features, ops
        if quantized([mlp.gate_proj, mlp.up_proj, mlp.down_proj]):  # kept, under their names
            self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
            self.gate_up_proj = QuantizedGroup([mlp.gate_proj, mlp.up_proj])
        else:
            self.gate_up_proj = FusedLinear([mlp.gate_proj, mlp.up_proj], micro)
            self.down_proj = FusedLinear([mlp.down_proj], micro)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # (N, 2 I)
        if self.ops is not None:
            return self.down_proj(self.ops.silu_mul(gate_up))
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class MatVecHead(nn.Module):
    """The LM head over one copy of its weight.  With the micro-kernel: packed for it
    (`PackedMatmul`; a tied embedding then reads its rows from that copy, `PackedEmbedding`, and
    `num_weight_bytes` counts the table once).  Else the same Parameter (a tied table stays one),
    `torch.mv` at one row, where it reads the table faster than `F.linear`, and `F.linear`
    otherwise."""

    def __init__(self, head: nn.Linear, micro=None):
        super().__init__()
        self.matmul = None if micro is None else PackedMatmul(head.weight.detach(), None, micro)
        # Packed: the tiles are the one copy, and no Parameter holds the table any more.
        self.weight = head.weight if self.matmul is None else None  # (V, hidden), the same Parameter
        self.num_weight_bytes = 0 if self.matmul is None else self.matmul.num_weight_bytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.matmul is not None:
            return self.matmul(x)
        if x.dim() == 2 and x.shape[0] == 1:
            return torch.mv(self.weight, x[0])[None]  # (1, V)
        return F.linear(x, self.weight)


class PackedEmbedding(nn.Module):
    """A tied input embedding whose table is the LM head's packed copy: ids (...) -> (..., hidden),
    the rows `nn.Embedding` gave (`weight` is the packed table, for its device and dtype)."""

    def __init__(self, head: PackedMatmul):
        super().__init__()
        self.head = head
        self.weight = head.packed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head.rows(ids)


def fused_unavailable(model: CausalLM) -> str | None:
    """Why the fused path cannot run on `model`, or None when it can."""
    layer = model.model.layers[0]
    projections = {type(layer.self_attn.q_proj), type(layer.mlp.up_proj)}
    if not projections <= {nn.Linear, QuantizedLinear}:
        return f"the projections are {sorted(t.__name__ for t in projections)}, not nn.Linear or QuantizedLinear"
    if model.device.type == "cuda":
        from minilm_engine.model.attention.backends import triton_unavailable_reason

        reason = triton_unavailable_reason(model.device, model.dtype)
        return None if reason is None else f"on a GPU its small ops are Triton kernels, and {reason}"
    if model.device.type != "cpu":
        return f"it runs on a CPU or a CUDA GPU, and the model is on {model.device}"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if model.dtype not in PACKABLE_DTYPES:
        return f"oneDNN packs fp32 and bf16 weights here, and the model is {model.dtype}"
    if model.dtype == torch.bfloat16 and not native_bf16_matmul() and cpu_compiled.load() is None:
        return f"this CPU has no bf16 support in oneDNN, and no micro-kernel ({cpu_compiled.unavailable_reason()})"
    return None


def fuse_layers(model: CausalLM, micro=None, ops=None) -> CausalLM:
    """Swap, in place, every layer's attention and MLP for the fused modules (matmuls on the
    micro-kernel `micro` when given, else torch's), and, with `ops` (the micro-kernel or
    `TRITON_OPS`), the norms for `KernelRMSNorm`s.  The old projection weights are dropped."""
    for layer in model.model.layers:
        layer.self_attn = FusedAttention(layer.self_attn, micro, ops)
        layer.mlp = FusedMLP(layer.mlp, micro, ops)
        if ops is not None:
            layer.input_layernorm = KernelRMSNorm(layer.input_layernorm, ops)
            layer.post_attention_layernorm = KernelRMSNorm(layer.post_attention_layernorm, ops)
    if ops is not None:
        model.model.norm = KernelRMSNorm(model.model.norm, ops)
    return model


@torch.no_grad()
def fuse_for_cpu(model: CausalLM, microkernel: bool | None = None) -> CausalLM:
    """`fuse_layers` with the micro-kernel, and the head swapped for `MatVecHead` (a tied table
    moves into the head).  `microkernel`: None (the default) or True, the kernel wherever it
    builds (None warns where it does not); False: nowhere (the benchmarks' "before": torch's
    matmuls)."""
    micro = None if microkernel is False else cpu_compiled.load()
    if micro is None and microkernel is not False:
        warnings.warn(f"fused CPU path without the micro-kernel ({cpu_compiled.unavailable_reason()}): "
                      "its matmuls run on torch (oneDNN / MKL)", stacklevel=3)
    fuse_layers(model, micro, micro)
    if type(model.lm_head) is nn.Linear and model.lm_head.bias is None:
        tied = model.lm_head.weight is model.model.embed_tokens.weight
        model.lm_head = MatVecHead(model.lm_head, micro)
        if tied and isinstance(model.lm_head.matmul, PackedMatmul):  # the table now lives in the head
            model.model.embed_tokens = PackedEmbedding(model.lm_head.matmul)
    return model


@torch.no_grad()
def fuse_for_gpu(model: CausalLM) -> CausalLM:
    """`fuse_layers` with the Triton kernels for the small ops and cuBLAS for the matmuls; the
    head stays `nn.Linear` (one matmul that already reads its table at the copy bandwidth)."""
    from minilm_engine.model.triton_fused_ops import TRITON_OPS

    return fuse_layers(model, None, TRITON_OPS)


def resolve_model_backend(requested: str | None) -> tuple[str, bool]:
    """(backend, asked for explicitly): `requested`, or `$MINILM_MODEL_BACKEND` when it is None."""
    if requested is not None:
        return requested, True
    backend = os.environ.get(BACKEND_ENV, DEFAULT_MODEL_BACKEND)
    if backend not in MODEL_BACKENDS:
        raise ValueError(f"${BACKEND_ENV} must be one of {MODEL_BACKENDS}, got {backend!r}")
    return backend, False


def apply_model_backend(model: CausalLM, backend: str, explicit: bool = True) -> str:
    """Apply `backend` ("reference" or "fused") to a loaded model; returns the one in use.
    `explicit`: asked for by name, so say why where "fused" falls back (False, the default
    backend: fall back quietly, and on a GPU fuse only when `FUSED_GPU_BY_DEFAULT`)."""
    if backend not in MODEL_BACKENDS:
        raise ValueError(f"model_backend must be one of {MODEL_BACKENDS}, got {backend!r}")
    if backend == "reference" or (model.device.type == "cuda" and not explicit and not FUSED_GPU_BY_DEFAULT):
        return "reference"
    reason = fused_unavailable(model)
    if reason is not None:
        if explicit:
            warnings.warn(f"model_backend='fused' falls back to the readable model: {reason}", stacklevel=3)
        return "reference"
    (fuse_for_gpu if model.device.type == "cuda" else fuse_for_cpu)(model)
    return backend


def fused_weight_bytes(model: nn.Module) -> int:
    """Bytes held in fused weights (not parameters: invisible to `quantization.weight_bytes`)."""
    return sum(m.num_weight_bytes for m in model.modules() if isinstance(m, (FusedLinear, MatVecHead)))
