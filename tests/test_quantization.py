"""Tests for minilm_engine.model.quantization: formats, the module swap, kernels, checkpoints, errors.

The schemes are checked against bounds that follow from their definition (an element is off by
at most half a step); every fast kernel against the readable reference, layer by layer and by
greedy output token for token; a saved checkpoint against the in-memory model it came from.
The tiny random checkpoints of conftest.py cover every family (Llama, Mistral, Qwen2 with
biases, Qwen3 with q/k norms); their hidden sizes (32-64) take int4 group size 32.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.entrypoints.cli.main import main as cli_main
from minilm_engine.model.quantization import QuantizationConfig, QuantizationError, QuantizedLinear, schemes
from minilm_engine.model.quantization.calibration import output_error, search_scales
from minilm_engine.entrypoints.cli.quantize import quantize_checkpoint
from minilm_engine.model.quantization.kernels import select_kernel
from minilm_engine.course.baselines import STRATEGIES

GREEDY = SamplingParams(temperature=0, max_tokens=16)
INT8 = QuantizationConfig("int8", group_size=None)
INT4_G32 = QuantizationConfig("int4", group_size=32)


@pytest.fixture(params=["operators", "microkernel"])
def cpu_kernel(request):
    """A factory of CPU kernels, once with torch's operators for a few rows and once with the
    compiled micro-kernel (cpu_microkernel.cpp; the `cpu_microkernel` fixture skips, or fails
    in CI, where it cannot be built)."""
    from minilm_engine.model.quantization.kernels import cpu

    if request.param == "microkernel":
        request.getfixturevalue("cpu_microkernel")
    return lambda: cpu.CPUKernel(microkernel=request.param == "microkernel")


def texts(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


# ----------------------------------------------------------------------------------- schemes
@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 6),
    k=st.integers(1, 80),
    spread=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**16),
)
def test_int8_round_trip_within_half_a_step(n, k, spread, seed):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * spread
    scales = schemes.int8_scales(w)
    q = schemes.quantize_int8(w, scales)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    error = (schemes.dequantize_int8(q, scales) - w).abs()
    assert (error <= scales[:, None] / 2 * (1 + 1e-5) + 1e-30).all()


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 5),
    k=st.integers(1, 150),
    group_size=st.sampled_from([32, 64, 128]),
    shift=st.floats(-10, 10),
    seed=st.integers(0, 2**16),
)
def test_int4_round_trip_within_half_a_step(n, k, group_size, shift, seed):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) + shift
    scales, offsets = schemes.int4_params(w, group_size)
    codes = schemes.quantize_int4(w, scales, offsets, group_size)
    assert codes.shape == (n, schemes.padded_in_features(k, group_size))
    assert int(codes.max()) <= 15
    back = schemes.dequantize_int4(codes, scales, offsets, k)
    step = scales.repeat_interleave(group_size, dim=1)[:, :k]  # each element's own group
    assert ((back - w).abs() <= step / 2 + 1e-5 * (1 + w.abs())).all()
    # min and max of each group are represented (nearly) exactly: codes 0 and 15
    assert torch.allclose(back.amin(1), w.amin(1), atol=1e-5 * (1 + shift**2))


def test_int4_packing_layout():
    codes = torch.tensor([[1, 2, 15, 0], [7, 8, 3, 12]], dtype=torch.uint8)
    packed = schemes.pack_int4(codes)
    # even column in the low nibble: 1 | 2 << 4 = 0x21
    assert packed.tolist() == [[0x21, 0x0F], [0x87, 0xC3]]
    assert torch.equal(schemes.unpack_int4(packed), codes)
    every = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    assert torch.equal(schemes.unpack_int4(schemes.pack_int4(every)), every)


def test_outlier_costs_int8_per_channel_only_its_own_row():
    w = torch.randn(4, 256)
    w[2, 5] = 100.0  # one outlier in row 2
    err = (schemes.dequantize_int8(schemes.quantize_int8(w, s := schemes.int8_scales(w)), s) - w).abs()
    assert err[2].max() > 10 * err[[0, 1, 3]].max()


# ------------------------------------------------------------------------- the quantized layer
@pytest.mark.parametrize("config", [INT8, INT4_G32, QuantizationConfig("int4", group_size=128)])
@pytest.mark.parametrize("shape", [(16, 32), (20, 48), (64, 320)])
def test_cpu_kernel_equals_reference_layer(config, shape, cpu_kernel):
    torch.manual_seed(0)
    N, K = shape
    linear = nn.Linear(K, N, bias=True)
    reference = QuantizedLinear.from_linear(linear, config, input_scales=torch.rand(K) + 0.5)
    fast = QuantizedLinear.from_linear(linear, config, input_scales=torch.rand(K) + 0.5)
    fast.input_scales.copy_(reference.input_scales)
    fast.qweight, fast.scales = reference.qweight.clone(), reference.scales.clone()
    if config.scheme == "int4":
        fast.offsets = reference.offsets.clone()
    kernel = cpu_kernel()
    kernel.prepare(fast)
    fast.kernel = kernel
    for x in (torch.randn(1, K), torch.randn(2, 1, K), torch.randn(3, 7, K), torch.randn(3, 30, K)):  # operator, then BLAS
        torch.testing.assert_close(fast(x), reference(x), rtol=1e-5, atol=1e-5)
    x = torch.randn(3, 7, K)
    expected = reference(x)
    # and the reference is what the dequantized weight gives
    manual = x @ reference.dequantized_weight().T + linear.bias
    torch.testing.assert_close(expected, manual.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", [QuantizationConfig("int8", group_size=None, scale_dtype="bfloat16"),
                                    QuantizationConfig("int4", group_size=64, scale_dtype="bfloat16")])
def test_cpu_kernel_in_bfloat16(config, cpu_kernel):
    """bf16 activations take the operators' vectorized path; equal up to bf16 rounding."""
    torch.manual_seed(0)
    linear = nn.Linear(320, 96, bias=True).bfloat16()
    reference = QuantizedLinear.from_linear(linear, config)
    fast = QuantizedLinear.from_linear(linear, config)
    kernel = cpu_kernel()
    kernel.prepare(fast)
    fast.kernel = kernel
    from minilm_engine.model.quantization.kernels.cpu import CPU_OP_MAX_ROWS

    for M in (1, 5, CPU_OP_MAX_ROWS[config.scheme] + 1):  # the operators, then the scratch path
        x = torch.randn(M, 320).bfloat16()
        torch.testing.assert_close(fast(x).float(), reference(x).float(), rtol=2e-2, atol=3e-2)


@pytest.mark.parametrize("config", [QuantizationConfig("int8", group_size=None, scale_dtype="bfloat16"),
                                    QuantizationConfig("int4", group_size=128, scale_dtype="bfloat16")])
@pytest.mark.parametrize("native_bf16", [False, True])
def test_cpu_kernel_equals_the_reference_around_its_threshold(config, native_bf16, monkeypatch, cpu_kernel):
    """bf16, at row counts on both sides of the switch from the operators (or the micro-kernel)
    to dequantize+matmul, as on a CPU with and without native bf16 matmul: each path ran where
    the threshold says, and each equals the dequantize-then-matmul reference."""
    from minilm_engine.model.quantization.kernels import cpu, cpu_compiled

    monkeypatch.setattr(cpu, "native_bf16_matmul", lambda: native_bf16)
    torch.manual_seed(0)
    linear = nn.Linear(320, 200, bias=True).bfloat16()  # K padded to 384 for int4; N to 256
    reference = QuantizedLinear.from_linear(linear, config)
    fast = QuantizedLinear.from_linear(linear, config)
    kernel = cpu_kernel()
    kernel.prepare(fast)
    fast.kernel = kernel
    calls = []
    many_rows = kernel._many_rows
    monkeypatch.setattr(kernel, "_many_rows", lambda layer, x: calls.append(x.shape[0]) or many_rows(layer, x))
    most = cpu.microkernel_max_rows(config.scheme, torch.bfloat16)
    built = cpu_compiled.load()  # the build of this CPU decides, whether this kernel runs it or not
    bf16_dot = built is not None and built.bf16_dot()
    if native_bf16 and bf16_dot:  # the kernel multiplies on bf16 dot products: up to 64 rows
        assert most == cpu.BF16_DOT_MAX_ROWS
    elif native_bf16:  # measured there: int8's micro-kernel up to 16 rows, int4's operator always
        assert most == {"int8": 16, "int4": 0}[config.scheme]
    else:
        assert most == (None if config.scheme == "int8" else cpu.MICROKERNEL_MAX_ROWS)
    if not kernel.runs_microkernel(fast) or most == 0:
        most = cpu.CPU_OP_MAX_ROWS[config.scheme]  # torch's operators, then dequantize + BLAS
    edge = most or cpu.MICROKERNEL_MAX_ROWS  # int8 without native bf16: the micro-kernel at any M
    for M in (1, 4, edge - 1, edge, edge + 1, 2 * edge + 3):
        x = torch.randn(M, 320).bfloat16()
        expected = F.linear(x.float(), reference.dequantized_weight().float(), linear.bias.float())
        torch.testing.assert_close(fast(x).float(), expected, rtol=2e-2, atol=3e-2)
        torch.testing.assert_close(fast(x).float(), reference(x).float(), rtol=2e-2, atol=3e-2)
    # the fast path below the threshold, dequantize above it
    assert calls == ([] if most is None else [edge + 1] * 2 + [2 * edge + 3] * 2)


def test_quantized_layer_is_close_to_the_original():
    torch.manual_seed(0)
    linear = nn.Linear(256, 64, bias=False)
    x = torch.randn(10, 256)
    exact = linear(x)
    err8 = (QuantizedLinear.from_linear(linear, INT8)(x) - exact).abs().mean()
    err4 = (QuantizedLinear.from_linear(linear, INT4_G32)(x) - exact).abs().mean()
    err4_128 = (QuantizedLinear.from_linear(linear, QuantizationConfig("int4"))(x) - exact).abs().mean()
    assert err8 < err4 < err4_128 < exact.abs().mean() / 5


def test_awq_search_never_loses_to_round_to_nearest():
    torch.manual_seed(0)
    W = torch.randn(32, 64)
    X = torch.randn(200, 64) * torch.linspace(0.1, 10, 64)  # some channels much larger
    act_mean = X.abs().mean(0)
    s, alpha = search_scales(W, X, act_mean, INT4_G32)
    from minilm_engine.model.quantization.linear import fake_quantize

    awq = output_error(X, W, fake_quantize(W * s, INT4_G32) / s)
    rtn = output_error(X, W, fake_quantize(W, INT4_G32))
    assert alpha > 0 and awq < rtn



def test_calibration_runs_attention_on_the_models_device():
    """On a GPU the calibration pass built its attention mask on the CPU, and every AWQ
    quantization failed with a device mismatch.  The "meta" device stands in for CUDA: mixing it
    with a CPU tensor raises the same way."""
    from minilm_engine.model.quantization.calibration import collect_inputs

    class AttendingModel(nn.Module):  # the decoder's contract: attention on the model's device
        device = torch.device("meta")

        def forward(self, ids, positions, attn):
            q = torch.empty(len(ids), 2, 4, device=ids.device)  # (N, H, D)
            return attn.attend(0, q, q, q)

    assert collect_inputs(AttendingModel(), [torch.arange(5)]) == {}  # no projection: no rows

@pytest.mark.parametrize("N,K", [(64, 64), (128, 320), (192, 256)])
def test_cpu_int4_layout_is_learned_from_the_operator(N, K):
    """Whatever packing torch uses on this CPU, one of the known ones reproduces it (AVX2,
    AVX-512 and the non-vectorized build differ), and reading it back gives the codes: no ISA
    is assumed."""
    from minilm_engine.model.quantization.kernels.cpu import (
        KNOWN_INT4_LAYOUTS,
        learn_int4_layout,
        to_cpu_int4_layout,
        unpack_cpu_int4_transposed,
    )

    codes = torch.randint(0, 16, (N, K), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    layout = learn_int4_layout(codes, packed)
    assert layout is not None, "torch packs int4 in a tiling this kernel does not know"
    assert torch.equal(to_cpu_int4_layout(codes, layout), packed)
    unpacked = unpack_cpu_int4_transposed(packed, layout, torch.empty(K, N, dtype=torch.uint8)).t()
    assert torch.equal(unpacked.int(), codes)  # read back: the codes
    others = [other for other in KNOWN_INT4_LAYOUTS if other != layout and N % other.block_n == 0]
    assert all(not torch.equal(to_cpu_int4_layout(codes, other), packed) for other in others)  # the choice matters


@pytest.mark.parametrize("layout_index", [0, 1, 2])
def test_every_known_int4_layout_reads_back_its_codes(layout_index):
    """The pure packing functions, for every known layout whatever this CPU packs: W.T read
    back from the packed bytes is the codes transposed, in any output dtype."""
    from minilm_engine.model.quantization.kernels.cpu import (
        KNOWN_INT4_LAYOUTS,
        to_cpu_int4_layout,
        unpack_cpu_int4_transposed,
    )

    layout = KNOWN_INT4_LAYOUTS[layout_index]
    codes = torch.randint(0, 16, (128, 96), dtype=torch.int32)
    packed = to_cpu_int4_layout(codes, layout)
    for dtype in (torch.uint8, torch.bfloat16, torch.float32):
        out = torch.empty(96, 128, dtype=dtype)
        assert torch.equal(unpack_cpu_int4_transposed(packed, layout, out), codes.t().to(dtype))


@pytest.mark.parametrize("config", [INT8, INT4_G32])
def test_cpu_kernel_keeps_one_copy_of_the_weight(config, cpu_kernel):
    linear = nn.Linear(320, 96, bias=False)
    layer = QuantizedLinear.from_linear(linear, config)
    canonical = sum(b.numel() * b.element_size() for b in layer.buffers())
    kernel = cpu_kernel()
    kernel.prepare(layer)
    names = {name for name, _ in layer.named_buffers()}
    held = sum(b.numel() * b.element_size() for b in layer.buffers())
    if config.scheme == "int8" and kernel.micro is None:
        assert names == {"qweight", "scales"} and held == canonical
    elif config.scheme == "int8":  # the micro-kernel's tiles of 16 rows: 96 is whole tiles
        assert names == {"cpu_qweight", "scales"} and held == canonical
    else:
        assert names == {"cpu_qweight", "cpu_scales_and_zeros"}  # the canonical buffers are gone
        # N is padded from 96 to 128 rows for whole tiles; zeros ride beside the scales
        assert held <= canonical * 128 / 96 * 1.5


@pytest.mark.parametrize("config", [INT8, INT4_G32])
def test_cpu_kernel_many_rows_in_tiles_equal_the_reference(config, monkeypatch, cpu_kernel):
    """The many-row path dequantizes into one reused scratch; a layer too big for it goes in
    row tiles.  A scratch of 64 x 320 weights makes this 200-row layer take 4 tiles."""
    from minilm_engine.model.quantization.kernels import cpu

    monkeypatch.setattr(cpu, "SCRATCH_MAX_ELEMENTS", 64 * 320)
    torch.manual_seed(0)
    linear = nn.Linear(320, 200, bias=True)
    reference = QuantizedLinear.from_linear(linear, config)
    fast = QuantizedLinear.from_linear(linear, config)
    kernel = cpu_kernel()
    kernel.prepare(fast)
    fast.kernel = kernel
    most = cpu.CPU_OP_MAX_ROWS[config.scheme]
    for M in (1, most, most + 1, most + 40):
        x = torch.randn(M, 320)
        torch.testing.assert_close(fast(x), reference(x), rtol=1e-5, atol=1e-5)
    assert all(s.numel() <= 64 * 320 for s in kernel._scratch.values())


def test_cpu_kernel_on_an_unknown_int4_packing_still_equals_the_reference(monkeypatch, cpu_kernel):
    """A CPU whose packing is none of the known tilings: a warning, still one copy, and the
    many-row path reads the weight through the operator itself."""
    from minilm_engine.model.quantization.kernels import cpu

    monkeypatch.setattr(cpu, "KNOWN_INT4_LAYOUTS", ())
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=False)
    reference = QuantizedLinear.from_linear(linear, INT4_G32)
    fast = QuantizedLinear.from_linear(linear, INT4_G32)
    kernel = cpu_kernel()
    with pytest.warns(UserWarning, match="not one this kernel knows"):
        kernel.prepare(fast)
    fast.kernel = kernel
    assert fast.cpu_int4_layout is None and not hasattr(fast, "qweight")
    for M in (1, cpu.CPU_OP_MAX_ROWS["int4"] + 1):
        x = torch.randn(M, 64)
        torch.testing.assert_close(fast(x), reference(x), rtol=1e-5, atol=1e-5)


def test_kernel_selection():
    assert select_kernel("auto", torch.device("cpu"), torch.float32).name == "cpu"
    assert select_kernel("reference", torch.device("cpu"), torch.float32).name == "reference"


# ----------------------------------------------------------- whole models: every architecture
@pytest.mark.parametrize("scheme,options", [("int8", {}), ("int4", {"group_size": 32})])
def test_every_architecture_generates_quantized_fast_equals_reference(checkpoint, prompts, scheme, options):
    # kv_cache: one request at a time, so decode steps have one row and take the operators
    reference = LLM(checkpoint.path, quantization=scheme, quantization_config={**options, "kernel": "reference"})
    fast = BaselineLLM(checkpoint.path, quantization=scheme, quantization_config=options, strategy="kv_cache")
    layers = [m for m in fast.model.modules() if isinstance(m, QuantizedLinear)]
    assert len(layers) == 7 * fast.config.num_hidden_layers
    assert {m.kernel.name for m in layers} == {"cpu"}
    expected = texts(reference.generate(prompts, GREEDY, use_tqdm=False))
    assert texts(fast.generate(prompts, GREEDY, use_tqdm=False)) == expected
    assert all(len(t) > 0 for t in expected)
    # Hidden states of a whole forward agree tightly too.
    from minilm_engine.course.baselines.contiguous_cache import NoKVCache

    ids = torch.tensor(reference.tokenizer.encode(prompts[2]))  # (T,)
    positions = torch.arange(len(ids))
    valid = torch.ones(1, len(ids), dtype=torch.bool)
    with torch.no_grad():
        a = reference.model(ids, positions, NoKVCache(valid))
        b = fast.model(ids, positions, NoKVCache(valid))
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_quantized_weights_are_smaller_and_outputs_stay_close(checkpoints, prompts):
    path = checkpoints["qwen2"].path  # biases stay in the model dtype
    full = LLM(path)
    int8 = LLM(path, quantization="int8")
    int4 = LLM(path, quantization="int4", quantization_config={"group_size": 32})
    assert int4.weight_bytes < int8.weight_bytes < full.weight_bytes
    assert int8.num_parameters == full.num_parameters
    assert "int4" in repr(int4)
    first = lambda llm: texts(llm.generate(prompts, GREEDY, use_tqdm=False))  # noqa: E731
    agree = sum(a[:4] == b[:4] for a, b in zip(first(full), first(int8)))
    assert agree >= 4  # int8 rarely changes the first tokens of a peaked model


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_serving_strategy_runs_a_quantized_model(checkpoints, prompts, strategy):
    path = checkpoints["qwen3"].path
    options = {"group_size": 32}
    expected = texts(BaselineLLM(path, quantization="int4", quantization_config=options, strategy="no_cache").generate(prompts, GREEDY, use_tqdm=False))
    llm = BaselineLLM(path, quantization="int4", quantization_config=options, strategy=strategy)
    assert texts(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected


def test_awq_calibration_on_custom_text(checkpoints, prompts):
    llm = LLM(
        checkpoints["llama"].path,
        quantization="int4",
        quantization_config={"group_size": 32, "method": "awq", "calibration_texts": prompts * 4},
    )
    layer = llm.model.model.layers[0].self_attn.q_proj
    assert layer.input_scales is not None and not torch.all(layer.input_scales == 1)
    assert len(texts(llm.generate(prompts[:2], GREEDY, use_tqdm=False))[0]) > 0


# ------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("scheme,options", [("int8", {"method": "awq"}), ("int4", {"group_size": 32, "method": "awq"})])
def test_saved_checkpoint_reloads_to_identical_outputs(checkpoints, prompts, tmp_path, scheme, options):
    source = checkpoints["mistral"].path
    out = quantize_checkpoint(source, tmp_path / "q", scheme, options)
    entry = json.loads((out / "config.json").read_text())["quantization_config"]
    assert entry["scheme"] == scheme and entry["method"] == "awq"
    in_memory = LLM(source, quantization=scheme, quantization_config=options)
    reloaded = LLM(out)
    assert reloaded.quantization == in_memory.quantization
    assert reloaded.weight_bytes == in_memory.weight_bytes
    assert texts(reloaded.generate(prompts, GREEDY, use_tqdm=False)) == texts(
        in_memory.generate(prompts, GREEDY, use_tqdm=False)
    )
    for (name, a), b in zip(in_memory.model.state_dict().items(), reloaded.model.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(QuantizationError, match="already quantized"):
        LLM(out, quantization="int8")
    with pytest.raises(QuantizationError, match="already quantized"):
        quantize_checkpoint(out, tmp_path / "again", "int4")
    # the kernel is a run-time choice, the format is not
    assert LLM(out, quantization_config={"kernel": "reference"}).quantization.kernel == "reference"
    with pytest.raises(QuantizationError, match="only 'kernel'"):
        LLM(out, quantization_config={"group_size": 64})


def test_cli_quantize_writes_a_loadable_checkpoint(checkpoints, tmp_path, capsys):
    out = tmp_path / "q8"
    assert cli_main(["quantize", str(checkpoints["qwen2"].path), str(out), "--quantization", "int8"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert LLM(out).quantization.scheme == "int8"
    assert cli_main(["quantize", str(out), str(tmp_path / "x"), "--quantization", "int4"]) == 2
    assert "already quantized" in capsys.readouterr().err


# -------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "scheme,options,message",
    [
        ("int3", {}, "unknown quantization scheme 'int3'"),
        ("fp8", None, "supported: int8, int4"),
        (8, {}, "quantization must be one of"),
        ("int4", {"group_size": 100}, r"group_size must be one of \(32, 64, 128\)"),
        ("int8", {"group_size": 32}, "int8 has one scale per output channel"),
        ("int4", {"method": "gptq"}, "method must be one of"),
        ("int4", {"groupsize": 32}, "unknown quantization_config keys"),
        ("int4", {"calibration_texts": "one string"}, "non-empty list of strings"),
        ("int4", {"kernel": "cuda"}, "kernel must be one of"),
        ("int4", [1, 2], "quantization_config must be a dict"),
    ],
)
def test_bad_quantization_requests_are_refused(checkpoints, scheme, options, message):
    with pytest.raises(QuantizationError, match=message):
        LLM(checkpoints["llama"].path, quantization=scheme, quantization_config=options)


def test_group_size_that_does_not_divide_a_layer(checkpoints):
    path = checkpoints["llama3_rope"].path  # hidden size 48
    with pytest.raises(QuantizationError, match="does not divide in_features 48 of model.layers.0.self_attn.q_proj"):
        LLM(path, quantization="int4", quantization_config={"group_size": 32, "pad_in_features": False})
    padded = LLM(path, quantization="int4", quantization_config={"group_size": 32})  # pads 48 -> 64
    assert padded.model.model.layers[0].self_attn.q_proj.padded_in_features == 64
    assert len(texts(padded.generate(["Hello"], GREEDY, use_tqdm=False))[0]) > 0


def test_options_without_a_scheme_are_refused(checkpoints):
    with pytest.raises(QuantizationError, match="without quantization="):
        LLM(checkpoints["llama"].path, quantization_config={"group_size": 32})


def test_foreign_quantized_checkpoint_is_refused(checkpoints, tmp_path):
    import shutil

    folder = tmp_path / "gptq"
    shutil.copytree(checkpoints["llama"].path, folder)
    raw = json.loads((folder / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(QuantizationError, match="quant_method 'gptq'"):
        LLM(folder)


def test_quantized_models_as_speculative_target_and_draft(checkpoints, prompts, tmp_path):
    """A quantized model is an ordinary model to the engine: as the target (quantized on load)
    and as the draft (a quantized checkpoint), greedy output equals the target running alone."""
    import warnings

    path = checkpoints["qwen3"].path
    options = {"group_size": 32}
    draft = quantize_checkpoint(path, tmp_path / "draft-int8", "int8")
    alone = LLM(path, quantization="int4", quantization_config=options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "draft bigger than target" from counting buffers
        spec = LLM(path, quantization="int4", quantization_config=options,
                   speculative_config={"model": str(draft), "num_speculative_tokens": 3})
    assert texts(spec.generate(prompts, GREEDY, use_tqdm=False)) == texts(alone.generate(prompts, GREEDY, use_tqdm=False))
    stats = spec.engine.spec_decoding_stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0  # drafts were verified, some kept


# ------------------------------------------------------------------ the LM head, quantized on request
@pytest.mark.parametrize("family", ["qwen2", "mistral"])  # tied embedding and head; untied
@pytest.mark.parametrize("scheme,options", [("int8", {}), ("int4", {"group_size": 32})])
def test_quantized_lm_head_fast_equals_reference_and_reloads(checkpoints, prompts, tmp_path, family, scheme, options):
    source = checkpoints[family].path
    options = {**options, "lm_head": True}
    plain = LLM(source, quantization=scheme, quantization_config={k: v for k, v in options.items() if k != "lm_head"})
    reference = LLM(source, quantization=scheme, quantization_config={**options, "kernel": "reference"})
    fast = BaselineLLM(source, quantization=scheme, quantization_config=options, strategy="kv_cache")
    head, embedding = fast.model.lm_head, fast.model.model.embed_tokens
    assert isinstance(head, QuantizedLinear) and head.kernel.name == "cpu"
    assert not isinstance(plain.model.lm_head, QuantizedLinear)  # nn.Linear, or the fused path's MatVecHead
    # untied: the head's float weight is gone; tied: the embedding keeps the table, so the
    # quantized head is extra memory (what a decode step reads per token still shrinks)
    tied = fast.config.tie_word_embeddings
    assert (fast.weight_bytes > plain.weight_bytes) if tied else (fast.weight_bytes < plain.weight_bytes)
    # the embedding keeps its full-precision table: the lookup is what the source model does
    full = LLM(source)  # fused: a tied table may live in the packed head, so compare what a lookup gives
    ids = torch.arange(full.config.vocab_size)
    assert torch.equal(embedding(ids), full.model.model.embed_tokens(ids))
    # the head is the layer the source head would quantize to: its reference equals dequantize @ x
    x = torch.randn(3, head.in_features)
    ref_head = reference.model.lm_head
    torch.testing.assert_close(ref_head(x), x @ ref_head.dequantized_weight().T)
    torch.testing.assert_close(head(x[:1]), ref_head(x[:1]), rtol=1e-4, atol=1e-4)
    expected = texts(reference.generate(prompts, GREEDY, use_tqdm=False))
    assert texts(fast.generate(prompts, GREEDY, use_tqdm=False)) == expected
    # a saved checkpoint (the tied embedding written once, the head as codes) reloads identically
    out = quantize_checkpoint(source, tmp_path / "q", scheme, options)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["lm_head"] is True
    reloaded = LLM(out, quantization_config={"kernel": "reference"})
    assert reloaded.quantization.lm_head and isinstance(reloaded.model.lm_head, QuantizedLinear)
    assert reloaded.weight_bytes == reference.weight_bytes
    for (name, a), b in zip(reference.model.state_dict().items(), reloaded.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert texts(reloaded.generate(prompts, GREEDY, use_tqdm=False)) == expected
    assert texts(LLM(out).generate(prompts, GREEDY, use_tqdm=False)) == expected


def test_quantized_lm_head_with_awq_and_the_cli(checkpoints, prompts, tmp_path):
    source = checkpoints["qwen2"].path
    llm = LLM(source, quantization="int8", quantization_config={"method": "awq", "lm_head": True})
    assert llm.model.lm_head.input_scales is None  # the head is round to nearest
    assert llm.model.model.layers[0].self_attn.q_proj.input_scales is not None
    out = tmp_path / "q8"
    assert cli_main(["quantize", str(source), str(out), "--quantization", "int8", "--quantize-lm-head"]) == 0
    assert LLM(out).quantization.lm_head
    with pytest.raises(QuantizationError, match="lm_head must be a bool"):
        LLM(source, quantization="int8", quantization_config={"lm_head": "yes"})


@pytest.mark.parametrize("scheme,most", [("int8", 0.31), ("int4", 0.23)])
def test_a_quantized_model_holds_one_layout_of_each_weight(scheme, most):
    """On any CPU: no layer keeps the canonical buffers beside the kernel's own packing, and the
    shipped chef's weights shrink as one copy would (its tied embedding stays full precision)."""
    full = LLM("noodle-chef")
    quantized = LLM("noodle-chef", quantization=scheme)
    layers = [m for m in quantized.model.modules() if isinstance(m, QuantizedLinear)]
    assert layers and {m.kernel.name for m in layers} == {"cpu"}
    for layer in layers:
        names = {name for name, _ in layer.named_buffers()}
        assert not ({"qweight", "cpu_qweight"} <= names), f"{layer} holds two layouts: {names}"
    assert quantized.weight_bytes <= most * full.weight_bytes
    assert texts(quantized.generate(["One bowl of"], GREEDY, use_tqdm=False))[0]
