"""The Triton weight-only kernels equal the reference (dequantize then matmul).

Without CUDA they run in the Triton interpreter (TRITON_INTERPRET=1, set by conftest.py before
anything imports triton); with CUDA they run natively, in fp32 and the GPU's half types.
Shapes are small but hit the edges: N and K not multiples of the tiles, a ragged last int4
group (K = 48 with groups of 32), M = 1 (the GEMV kernel), M = 5 and 37 (the tiled kernel
with partial row tiles), biases, and the activation-aware input scales.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="Triton is not installed (it comes with the 'test' extra on Linux x86-64)")

from minilm_engine import LLM, SamplingParams  # noqa: E402
from minilm_engine.model.quantization import QuantizationConfig, QuantizedLinear  # noqa: E402
from minilm_engine.model.quantization.kernels import make_kernel, triton_weight_only  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cpu" and not triton_weight_only.is_interpreted():
    pytest.skip("no GPU, and triton was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)
DTYPES = [torch.float32] + ([torch.bfloat16, torch.float16] if DEVICE.type == "cuda" else [])
TOLERANCES = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=1e-2, atol=1e-2),
              torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}
CONFIGS = {
    "int8": QuantizationConfig("int8", group_size=None),
    "int4-g32": QuantizationConfig("int4", group_size=32),
    "int4-g128": QuantizationConfig("int4", group_size=128),
}


def pair(config, N, K, bias, dtype):
    """(reference layer in fp32, triton layer in `dtype`) holding the same numbers."""
    torch.manual_seed(N * 1000 + K)
    linear = nn.Linear(K, N, bias=bias)
    fast = QuantizedLinear.from_linear(linear, config, input_scales=torch.rand(K) + 0.5).to(DEVICE, dtype)
    reference = copy.deepcopy(fast).float()  # half-precision scales are exact in fp32
    fast.kernel = make_kernel("triton")
    return reference, fast


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("M,N,K,bias", [(1, 24, 48, True), (1, 64, 256, False), (5, 40, 96, False), (37, 16, 160, True)])
def test_triton_equals_reference(config, M, N, K, bias, dtype):
    reference, fast = pair(config, N, K, bias, dtype)
    x = torch.randn(M, K, device=DEVICE).to(dtype)
    with torch.no_grad():
        expected = reference(x.float())
        got = fast(x)
    torch.testing.assert_close(got.float(), expected.float(), **TOLERANCES[dtype])


def test_batched_leading_dims_and_empty():
    reference, fast = pair(CONFIGS["int4-g32"], 16, 64, False, torch.float32)
    x = torch.randn(2, 3, 64, device=DEVICE)
    torch.testing.assert_close(fast(x), reference(x), rtol=1e-4, atol=1e-4)
    assert fast(torch.zeros(0, 64, device=DEVICE)).shape == (0, 16)


@pytest.mark.slow
@pytest.mark.parametrize("scheme,options", [("int8", {}), ("int4", {"group_size": 32}), ("int4", {"group_size": 32, "lm_head": True})])
def test_triton_greedy_equals_reference(checkpoints, prompts, scheme, options):
    """Token for token through the whole engine (the interpreter is slow: a small run)."""
    path = checkpoints["qwen2"].path
    params = SamplingParams(temperature=0, max_tokens=4)
    device = "cuda" if DEVICE.type == "cuda" else "cpu"
    reference = LLM(path, device=device, dtype="float32", quantization=scheme,
                    quantization_config={**options, "kernel": "reference"})
    fast = LLM(path, device=device, dtype="float32", quantization=scheme,
               quantization_config={**options, "kernel": "triton"})
    assert fast.model.model.layers[0].mlp.up_proj.kernel.name == "triton"
    if options.get("lm_head"):  # the tied head, quantized, on the same kernel
        assert fast.model.lm_head.kernel.name == "triton"
    ids = lambda llm: [o.outputs[0].token_ids for o in llm.generate(prompts[:2], params, use_tqdm=False)]  # noqa: E731
    assert ids(fast) == ids(reference)


def test_unavailable_reason_on_an_old_gpu(monkeypatch):
    if DEVICE.type != "cuda":
        assert triton_weight_only.unavailable_reason(torch.device("cpu")) is None  # interpreted
        return
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert "7.5" in triton_weight_only.unavailable_reason(torch.device("cuda"))
