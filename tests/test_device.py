"""Tests for minilm_engine.model.device: which device and dtype a model gets, and the clear errors."""

from __future__ import annotations

import contextlib

import pytest
import torch

from minilm_engine.model.device import choose_dtype, device_context, resolve_device, resolve_dtype

H200, A100, T4, V100 = (9, 0), (8, 0), (7, 5), (7, 0)


@pytest.mark.parametrize(
    "device_type, capability, expected",
    [("cpu", None, torch.float32), ("cuda", H200, torch.bfloat16), ("cuda", A100, torch.bfloat16),
     ("cuda", T4, torch.float16), ("cuda", V100, torch.float16)],
)
def test_auto_dtype_by_device(device_type, capability, expected):
    assert choose_dtype("auto", device_type, capability) == (expected, None)


@pytest.mark.parametrize("spec", ["bfloat16", "bf16", torch.bfloat16])
def test_bfloat16_on_a_t4_falls_back_to_float16_with_a_reason(spec):
    dtype, warning = choose_dtype(spec, "cuda", T4)
    assert dtype == torch.float16
    assert "compute capability 7.5" in warning and "float16" in warning


@pytest.mark.parametrize(
    "spec, expected",
    [("float32", torch.float32), ("fp32", torch.float32), ("float", torch.float32), ("FP16", torch.float16),
     ("half", torch.float16), ("bf16", torch.bfloat16), (torch.float16, torch.float16)],
)
def test_names_are_understood_everywhere(spec, expected):
    for device_type, capability in (("cpu", None), ("cuda", H200)):
        assert choose_dtype(spec, device_type, capability) == (expected, None)


@pytest.mark.parametrize("spec", ["float64", "int8", "fp8", 16, None, torch.float64, torch.int8])
def test_unknown_or_unsupported_dtypes_are_refused(spec):
    with pytest.raises(ValueError, match="dtype"):
        choose_dtype(spec, "cpu", None)


def test_resolve_on_this_machine():
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16  # a CPU runs bf16 (slowly), no fallback
    if torch.cuda.is_available():
        assert resolve_dtype("auto", torch.device("cuda")) in (torch.bfloat16, torch.float16)


def test_resolve_device(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.delenv("MINILM_DEVICE", raising=False)
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("MINILM_DEVICE", "cpu")
    assert resolve_device(None) == torch.device("cpu")
    monkeypatch.setenv("MINILM_DEVICE", "tpu")
    with pytest.raises(ValueError, match="device must be"):
        resolve_device(None)  # a wrong value in the environment is named too
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("mps")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device("cuda")


@pytest.mark.parametrize(
    "capability, triton_version, runs",
    [((7, 5), "3.6.0", False), ((7, 5), "3.2.0", True), ((8, 0), "3.6.0", True), ((9, 0), "3.9.1", True)],
)
def test_a_t4_gets_the_torch_attention_with_the_reason(monkeypatch, capability, triton_version, runs):
    """Colab's T4 (7.5) with Colab's Triton 3.6: "auto" must not pick kernels Triton cannot build."""
    pytest.importorskip("triton")
    import triton

    from minilm_engine.model.attention import backends, triton_paged_prefill
    from minilm_engine.course.teaching.notebook import attention_summary

    monkeypatch.setattr(triton_paged_prefill, "is_interpreted", lambda: False)  # as on a real GPU
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(triton, "__version__", triton_version)
    reason = backends.triton_unavailable_reason(torch.device("cuda"), torch.float16)
    assert (reason is None) == runs
    summary = attention_summary(torch.device("cuda"), torch.float16)
    if runs:
        assert summary == "triton kernels"
    else:
        assert "compute capability 7.5" in reason and "T4" in reason
        assert summary.startswith("torch reference, because Triton 3.6.0")
        assert choose_dtype("auto", "cuda", capability) == (torch.float16, None)


def test_device_context_makes_the_models_gpu_current():
    """Built, not entered: no GPU needed to check which device it would make current."""
    context = device_context(torch.device("cuda", 1))
    assert isinstance(context, torch.cuda.device) and context.idx == 1
    assert isinstance(device_context(torch.device("cpu")), contextlib.nullcontext)
