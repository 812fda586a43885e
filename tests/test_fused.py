"""Tests for minilm_engine.model.fused: the fused CPU path against the readable decoder.

The fused path changes how the matmuls run, not the math, so greedy decoding must give the
same tokens as the readable model on every tiny checkpoint (each family: q/k/v biases, q/k
norms, GQA ratios, tied and untied heads), one request and a batch, and the logits must agree
to float tolerance.  Where it cannot run it must say why and keep the readable model.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from minilm_engine.model.device import native_bf16_matmul
from minilm_engine import LLM, SamplingParams
from minilm_engine.model.attention.reference import NoKVCache
from minilm_engine.model.decoder import MLP, Attention
from minilm_engine.model.fused import (
    FusedAttention, FusedLinear, FusedMLP, MatVecHead, apply_model_backend, fuse_for_cpu,
)
from minilm_engine.model.quantization.kernels import cpu_compiled, cpu_dense

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def engines(path, **kwargs) -> tuple[LLM, LLM]:
    args = dict(record_trace=False, kv_cache_memory=8 << 20, **kwargs)
    return LLM(path, model_backend="reference", **args), LLM(path, model_backend="fused", **args)


def test_fused_greedy_equals_the_readable_model_token_for_token(checkpoint, prompts):
    reference, fused = engines(checkpoint.path)
    # The fast path really ran: every layer swapped, the head too.
    assert fused.model_backend == "fused"
    assert all(isinstance(layer.self_attn, FusedAttention) and isinstance(layer.mlp, FusedMLP)
               for layer in fused.model.model.layers)
    assert isinstance(fused.model.lm_head, MatVecHead)
    assert all(isinstance(layer.self_attn, Attention) and isinstance(layer.mlp, MLP)
               for layer in reference.model.model.layers)
    for prompt in prompts:  # batch 1: the one-row matmuls and torch.mv at the head
        (want,) = reference.generate([prompt], GREEDY, use_tqdm=False)
        (got,) = fused.generate([prompt], GREEDY, use_tqdm=False)
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
    batched = fused.generate(prompts, GREEDY, use_tqdm=False)  # many rows, F.linear at the head
    alone = reference.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in batched] == [o.outputs[0].token_ids for o in alone]
    # The packed weights are counted, and hold what the readable projections held.
    assert fused.weight_bytes == reference.weight_bytes


def test_fused_logits_match_the_readable_model(checkpoint):
    reference, fused = engines(checkpoint.path)
    ids = torch.randint(0, reference.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.inference_mode():
        valid = torch.ones_like(ids, dtype=torch.bool)
        logits = [llm.model.compute_logits(llm.model(ids.flatten(), positions.flatten(),
                                                     NoKVCache(valid)))
                  for llm in (reference, fused)]
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-4)


def test_fused_in_bf16_gives_the_readable_bf16_tokens(checkpoint, prompts):
    # With the micro-kernel bf16 weights are packed in pairs on every CPU (a tied table too:
    # the embedding reads the head's copy); without it they are packed for oneDNN, and a CPU
    # whose oneDNN has no bf16 (AVX2 only) keeps the readable model, and says so.
    if cpu_compiled.load() is not None:
        reference, fused = engines(checkpoint.path, dtype="bfloat16")
        proj = fused.model.model.layers[0].mlp.gate_up_proj
        assert fused.model_backend == "fused" and isinstance(proj.matmul, cpu_dense.PackedMatmul)
        assert isinstance(fused.model.lm_head.matmul, cpu_dense.PackedMatmul)
        assert fused.weight_bytes == reference.weight_bytes  # the table counted once, padding not at all
    elif native_bf16_matmul():  # oneDNN's packed copy for the projections (see fuse_for_cpu)
        reference, fused = engines(checkpoint.path, dtype="bfloat16")
        assert fused.model_backend == "fused" and fused.model.model.layers[0].mlp.gate_up_proj.onednn_packed
    else:
        with pytest.warns(UserWarning, match="falls back to the readable model: this CPU has no bf16 support"):
            reference, fused = engines(checkpoint.path, dtype="bfloat16")
        assert fused.model_backend == "reference"
    want = reference.generate(prompts[:2], GREEDY, use_tqdm=False)
    got = fused.generate(prompts[:2], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]


def test_fused_falls_back_with_the_reason_where_it_cannot_run(checkpoints):
    llm = LLM(checkpoints["llama"].path, model_backend="reference", record_trace=False, kv_cache_memory=8 << 20)
    llm.model.model.layers[0].self_attn.q_proj = torch.nn.Identity()  # a projection it does not know
    with pytest.warns(UserWarning, match="falls back to the readable model: .*Identity"):
        assert apply_model_backend(llm.model, "fused") == "reference"
    with pytest.warns(UserWarning, match="oneDNN packs fp32 and bf16"):
        llm = LLM(checkpoints["llama"].path, dtype="float16", model_backend="fused",
                  record_trace=False, kv_cache_memory=8 << 20)
    assert llm.model_backend == "reference"
    with pytest.raises(ValueError, match="model_backend must be one of"):
        apply_model_backend(llm.model, "compiled")


def test_the_default_backend_comes_from_the_environment(checkpoints, monkeypatch):
    path, args = checkpoints["llama"].path, dict(record_trace=False, kv_cache_memory=8 << 20)
    monkeypatch.delenv("MINILM_MODEL_BACKEND", raising=False)
    assert LLM(path, **args).model_backend == "fused"  # unset: the fast path, where it runs
    monkeypatch.setenv("MINILM_MODEL_BACKEND", "reference")
    assert LLM(path, **args).model_backend == "reference"
    assert LLM(path, model_backend="fused", **args).model_backend == "fused"  # the argument wins
    monkeypatch.setenv("MINILM_MODEL_BACKEND", "fused")
    assert LLM(path, model_backend="reference", **args).model_backend == "reference"  # the argument wins
    with warnings.catch_warnings():  # where it cannot run it falls back quietly: nobody asked this model
        warnings.filterwarnings("error", message=".*falls back")
        assert LLM(path, dtype="float16", **args).model_backend == "reference"
    monkeypatch.setenv("MINILM_MODEL_BACKEND", "compiled")
    with pytest.raises(ValueError, match=r"\$MINILM_MODEL_BACKEND must be one of"):
        LLM(path, **args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_headwise_norm_is_each_heads_own_norm_bit_for_bit(dtype):
    from minilm_engine.model.decoder import RMSNorm
    from minilm_engine.model.fused import HeadwiseRMSNorm

    q_norm, k_norm = RMSNorm(8, 1e-6), RMSNorm(8, 1e-6)
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5)
        k_norm.weight.uniform_(-1.0, 1.0)
    q_norm, k_norm = q_norm.to(dtype), k_norm.to(dtype)
    q = torch.randn(2, 3, 4, 8, dtype=dtype)  # (B, T, H, D)
    k = torch.randn(2, 3, 2, 8, dtype=dtype)  # (B, T, H_kv, D)
    together = HeadwiseRMSNorm([q_norm] * 4 + [k_norm] * 2)(torch.cat([q, k], dim=2))
    assert torch.equal(together, torch.cat([q_norm(q), k_norm(k)], dim=2))
    with pytest.raises(ValueError, match="different eps"):
        HeadwiseRMSNorm([q_norm, RMSNorm(8, 1e-5)])


def kernel_rows(llm: LLM) -> list[cpu_dense.PackedMatmul | None]:
    """Every micro-kernel matmul of a fused model (the projections and the head)."""
    return [m.matmul for m in llm.model.modules() if isinstance(m, (FusedLinear, MatVecHead))]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_equal_with_the_kernel_on_every_matmul(cpu_microkernel, checkpoint, prompts, dtype):
    """The kernel on every projection and the head (`microkernel=True`), at every row count:
    every decode step and every prompt runs it."""
    args = dict(record_trace=False, kv_cache_memory=8 << 20, dtype=dtype)
    reference = LLM(checkpoint.path, model_backend="reference", **args)
    fused = LLM(checkpoint.path, model_backend="reference", **args)
    fuse_for_cpu(fused.model, microkernel=True)
    matmuls = kernel_rows(fused)
    assert matmuls and all(m is not None for m in matmuls)
    calls = []
    for m in matmuls:
        m.micro = CountingKernel(cpu_microkernel, calls)
    want = reference.generate(prompts, GREEDY, use_tqdm=False)
    got = fused.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert len(calls) >= len(matmuls) * (GREEDY.max_tokens - 1)  # the kernel ran at every step


def test_without_the_kernel_the_fused_path_runs_torch_and_says_why(checkpoint, prompts, monkeypatch):
    monkeypatch.setenv(cpu_compiled.ENV_SWITCH, "0")
    monkeypatch.setattr(cpu_compiled.EXTENSION, "tried", False)
    monkeypatch.setattr(cpu_compiled.EXTENSION, "module", None)
    monkeypatch.setattr(cpu_compiled.EXTENSION, "reason", None)
    reference = LLM(checkpoint.path, model_backend="reference", record_trace=False, kv_cache_memory=8 << 20)
    with pytest.warns(UserWarning, match=f"without the micro-kernel \\({cpu_compiled.ENV_SWITCH}=0\\)"):
        fused = LLM(checkpoint.path, model_backend="fused", record_trace=False, kv_cache_memory=8 << 20)
    assert fused.model_backend == "fused" and all(m is None for m in kernel_rows(fused))
    want = reference.generate(prompts[:2], GREEDY, use_tqdm=False)
    got = fused.generate(prompts[:2], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]


class CountingKernel:
    """The compiled module, with the row count of every `packed_mm` call recorded."""

    def __init__(self, micro, calls: list[int]):
        self.micro, self.calls = micro, calls

    def packed_mm(self, x, packed, N, bias):
        self.calls.append(x.shape[0])
        return self.micro.packed_mm(x, packed, N, bias)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_models_run_the_fused_path_with_the_readable_tokens(checkpoint, prompts, scheme, cpu_microkernel):
    # The quantized projections stay themselves (their codes, their CPU kernel, their names);
    # the layer around them and the head run fused.  The same bits per projection, so the
    # same greedy tokens, one request and a batch.
    from minilm_engine.model.fused import QuantizedGroup
    from minilm_engine.model.quantization.linear import QuantizedLinear

    reference, fused = engines(checkpoint.path, quantization=scheme, quantization_config={"kernel": "cpu"})
    assert fused.model_backend == "fused"
    layer = fused.model.model.layers[0]
    assert isinstance(layer.self_attn, FusedAttention) and isinstance(layer.self_attn.qkv_proj, QuantizedGroup)
    assert isinstance(layer.mlp.gate_up_proj, QuantizedGroup) and isinstance(layer.mlp.down_proj, QuantizedLinear)
    assert layer.self_attn.q_proj.kernel.name == "cpu" and layer.self_attn.q_proj.kernel.runs_microkernel(layer.self_attn.q_proj)
    assert isinstance(fused.model.lm_head, MatVecHead)
    # What was loaded is still there under its names, counted once; only the head's table (and a
    # tied embedding's, the same one) moved into the head's packed copy.
    moved = {"lm_head.weight", "model.embed_tokens.weight"}
    assert set(fused.model.state_dict()) - moved == set(reference.model.state_dict()) - moved
    assert fused.weight_bytes == reference.weight_bytes
    for prompt in prompts[:2]:
        (want,) = reference.generate([prompt], GREEDY, use_tqdm=False)
        (got,) = fused.generate([prompt], GREEDY, use_tqdm=False)
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
    batched = fused.generate(prompts, GREEDY, use_tqdm=False)
    alone = reference.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in batched] == [o.outputs[0].token_ids for o in alone]
