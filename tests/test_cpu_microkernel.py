"""The compiled CPU micro-kernel (model/quantization/kernels/cpu_microkernel.cpp) against plain fp32
arithmetic on the (dequantized) weight: every row count across its blocks of rows, shapes that
are not whole tiles or whole vectors, both of torch's vectorized int4 packings (whatever this
CPU packs), bf16 and fp32 weights packed for `packed_mm` at every row count 1..70, across its
chunks and 1 or 2 threads, float32 and bfloat16 activations and scales.  Skipped where it cannot be built, except under
MINILM_REQUIRE_MICROKERNEL=1 (CI), where that is a failure."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minilm_engine.model.quantization import schemes
from minilm_engine.model.attention import cpu_compiled as attention_cpu_compiled
from minilm_engine.model.quantization.kernels import cpu, cpu_compiled, cpu_dense


@pytest.fixture
def micro(cpu_microkernel):
    return cpu_microkernel


def close(y: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """fp32 accumulation on both sides: equal up to fp32 sums, or the output's bf16 rounding."""
    scale = expected.abs().max().item()
    tol = 1e-5 if dtype == torch.float32 else 8e-3  # bf16 keeps 8 significant bits
    torch.testing.assert_close(y.float(), expected, rtol=0, atol=tol * scale)


# 63: an odd pair of inputs; 70 and 13: pairs past the last whole group of 4 and 2 (one and two
# rows of x keep 4 and 2 sums of alternating pairs)
@pytest.mark.parametrize("N,K", [(16, 64), (40, 320), (200, 96), (33, 63), (24, 70), (17, 13)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_equals_fp32_arithmetic(micro, N, K, dtype):
    torch.manual_seed(N + K)
    w = torch.randn(N, K)
    scales = schemes.int8_scales(w, scale_dtype=dtype).to(dtype)
    codes = schemes.quantize_int8(w, scales)
    tiles = cpu.tile_int8(codes)
    assert torch.equal(tiles.transpose(1, 2).reshape(-1, K)[:N], codes)  # untiled: the codes
    weight = codes.float() * scales.float()[:, None]  # (N, K)
    for M in range(1, 26):  # every remainder of a block of 6 rows (fp32) and of 12 (bf16 dots)
        x = torch.randn(M, K).to(dtype)
        close(micro.int8_mm(x, tiles, scales), x.float() @ weight.t(), dtype)


@pytest.mark.parametrize("N,K", [(1, 1), (16, 2), (17, 63), (48, 64), (130, 129)])  # odd K: a half pair
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_packed_equals_fp32_arithmetic_at_every_row_count(micro, N, K, dtype, num_threads):
    """Weights packed for `packed_mm` (bf16 in pairs, fp32 k-major): 1..70 rows cover every
    remainder of the row block (8 rows, 2 on AVX2 in fp32) with one and two tiles, 1 row its own
    path, 129 and 260 a chunk of 128 rows and its remainder; with and without a bias."""
    torch.manual_seed(N * K)
    weight, bias = torch.randn(N, K).to(dtype), torch.randn(N).to(dtype)
    packed = cpu_dense.pack_for_kernel(weight)
    pairs = dtype == torch.bfloat16
    assert packed.shape == ((-(-N // 16), -(-K // 2), 16, 2) if pairs else (-(-N // 16), K, 16))
    ids = torch.arange(N).flip(0)
    assert torch.equal(cpu_dense.packed_rows(packed, ids, K), weight[ids])  # read back: the rows
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        for M in list(range(1, 71)) + [129, 260]:
            x = torch.randn(M, K).to(dtype)
            expected = x.float() @ weight.float().t()  # (M, N)
            close(micro.packed_mm(x, packed, N, None), expected, dtype)
            close(micro.packed_mm(x, packed, N, bias), expected + bias.float(), dtype)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_matmul_is_f_linear_to_rounding(micro, dtype):
    torch.manual_seed(0)
    weight, bias = torch.randn(1000, 1024).to(dtype), torch.randn(1000).to(dtype)
    matmul = cpu_dense.PackedMatmul(weight, bias, micro)
    for shape in ((1, 1024), (3, 5, 1024)):
        x = torch.randn(*shape).to(dtype)
        expected = F.linear(x.float(), weight.float(), bias.float())
        close(matmul(x), expected, dtype)
        assert matmul(x).shape == (*shape[:-1], 1000)
    with pytest.raises(ValueError, match="bf16 or fp32 weights"):
        cpu_dense.PackedMatmul(weight.half(), None, micro)


@pytest.mark.parametrize("block_n", [32, 64])  # AVX2's and AVX-512's packings, on any CPU
@pytest.mark.parametrize("group_size,K", [(32, 64), (64, 320), (128, 200)])  # 320 and 200: K padded
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_equals_fp32_arithmetic(micro, block_n, group_size, K, dtype):
    torch.manual_seed(block_n + K)
    N = 200  # padded to whole tiles of block_n rows
    w = torch.randn(N, K)
    scales, offsets = schemes.int4_params(w, group_size, scale_dtype=dtype)
    codes = schemes.quantize_int4(w, scales, offsets, group_size)  # (N, K_padded)
    weight = schemes.dequantize_int4(codes, scales, offsets, K)  # (N, K) fp32
    N_padded = -(-N // block_n) * block_n
    packed = cpu.to_cpu_int4_layout(F.pad(codes, (0, 0, 0, N_padded - N)), cpu.Int4Layout(block_n))
    zeros = offsets + 8 * scales  # torch's table: w = (q - 8) * scale + zero
    table = F.pad(torch.stack([scales.t(), zeros.t()], dim=-1), (0, 0, 0, N_padded - N)).to(dtype).contiguous()
    for M in (1, 2, 5, 6, 7, 12, 13, 25):
        x = torch.randn(M, K).to(dtype)
        close(micro.int4_mm(x, packed, block_n, table, group_size, N), x.float() @ weight.t(), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms_rotary_and_silu_mul_are_the_readable_ops(micro, dtype):
    """The fused path's small ops against decoder.RMSNorm, rope.apply_rotary and silu(g) * u:
    the same roundings, the sums of squares in another order."""
    from minilm_engine.model.decoder import RMSNorm
    from minilm_engine.model.rope import apply_rotary

    torch.manual_seed(0)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    norm = RMSNorm(96, 1e-6).to(dtype)
    norm.weight.data.normal_()
    x = torch.randn(5, 96).to(dtype)
    torch.testing.assert_close(micro.rms_norm(x, norm.weight.detach(), 1e-6), norm(x), **tol)
    N, H, D = 3, 4, 16
    qkv = torch.randn(N, H * D + 8).to(dtype)  # q and k heads, then v's columns (untouched)
    cos, sin = torch.randn(N, D).to(dtype), torch.randn(N, D).to(dtype)
    head_norms = [RMSNorm(D, 1e-6).to(dtype) for _ in range(H)]
    for head_norm in head_norms:
        head_norm.weight.data.normal_()
    qk = qkv[:, : H * D].view(N, H, D)
    want = apply_rotary(torch.stack([head_norms[h](qk[:, h]) for h in range(H)], dim=1), cos, sin)
    want_plain = apply_rotary(qk.clone(), cos, sin)
    torch.testing.assert_close(micro.norm_rotary_(qk.clone(), None, 0.0, cos, sin), want_plain, **tol)
    v = qkv[:, H * D :].clone()
    weight = torch.stack([n.weight.detach() for n in head_norms])  # (H, D)
    assert micro.norm_rotary_(qk, weight, 1e-6, cos, sin).data_ptr() == qkv.data_ptr()  # in place
    torch.testing.assert_close(qk, want, **tol)
    assert torch.equal(qkv[:, H * D :], v)
    for width in (40, 3072):  # a vector tail; several spans of 1,024 (a decode row of the 0.6B shape)
        gate_up = torch.randn(3, 2 * width).to(dtype)
        gate_up[0, :width] = torch.linspace(-100, 100, width)  # exp's clamps, both ends
        gate, up = gate_up.split(width, dim=-1)
        torch.testing.assert_close(micro.silu_mul(gate_up), F.silu(gate) * up, **tol)


def test_bad_shapes_are_refused_with_a_message(micro):
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match=r"codes must be \(ceil\(N/16\), K, 16\) int8"):
        micro.int8_mm(x, torch.zeros(1, 32, 16, dtype=torch.int8), torch.ones(16))
    with pytest.raises(RuntimeError, match="contiguous"):
        micro.int8_mm(x.t(), torch.zeros(1, 2, 16, dtype=torch.int8), torch.ones(16))
    with pytest.raises(RuntimeError, match="packed must be bfloat16 or float32"):
        micro.packed_mm(x.half(), torch.zeros(1, 64, 16).half(), 16, None)
    with pytest.raises(RuntimeError, match="bias must be"):
        micro.packed_mm(x, torch.zeros(1, 64, 16), 16, torch.randn(7))
    with pytest.raises(RuntimeError, match=r"packed must be \(ceil\(N / 16\), ceil\(K / 2\), 16, 2\) bf16"):
        micro.packed_mm(x.bfloat16(), torch.zeros(1, 16, 16, 2, dtype=torch.bfloat16), 16, None)
    with pytest.raises(RuntimeError, match="x must be a contiguous \\(M, K\\) matrix in packed's dtype"):
        micro.packed_mm(x, torch.zeros(1, 32, 16, 2, dtype=torch.bfloat16), 16, None)
    with pytest.raises(RuntimeError, match=r"packed must be \(ceil\(N / 16\), K, 16\) float32"):
        micro.packed_mm(x, torch.zeros(1, 32, 16), 16, None)
    with pytest.raises(RuntimeError, match="block_n must be a multiple of 32"):
        micro.int4_mm(x, torch.zeros(16, 32, dtype=torch.uint8), 16, torch.ones(2, 16, 2), 32, 16)


def test_each_cpu_gets_its_own_build(monkeypatch):
    """-march=native code must not be loaded on another CPU sharing the same home folder."""
    monkeypatch.setattr(cpu_compiled, "_cpu_flags", lambda: "fpu sse2 avx2")
    avx2 = cpu_compiled.build_name()
    monkeypatch.setattr(cpu_compiled, "_cpu_flags", lambda: "fpu sse2 avx2 avx512f")
    assert cpu_compiled.build_name() != avx2
    # and each -march its own build: MINILM_CPU_MARCH=haswell builds the AVX2 code on an AVX-512 CPU
    monkeypatch.delenv("MINILM_CPU_MARCH", raising=False)  # (the AVX2 rerun sets it)
    native = cpu_compiled.build_name()
    monkeypatch.setenv("MINILM_CPU_MARCH", "haswell")
    assert cpu_compiled.build_name() != native


def test_each_torch_install_gets_its_own_build(monkeypatch):
    """Two venvs on one machine (CI's main and Colab venvs, a user's two projects) must not share
    a build name: torch would rebuild the other's build on every first load."""
    from minilm_engine.model import cpu_build

    here = cpu_compiled.build_name()
    assert cpu_compiled.build_name() == here  # stable within one install
    monkeypatch.setattr(cpu_build, "torch_install", lambda: "2.11.0 /elsewhere/site-packages/torch")
    assert cpu_compiled.build_name() != here


def test_a_shared_header_is_pasted_in_and_changes_the_build_name(tmp_path, monkeypatch):
    from minilm_engine.model import cpu_build

    (tmp_path / "kernels").mkdir()
    header = tmp_path / "shared.h"
    header.write_text("inline int twice(int x) { return 2 * x; }\n")
    source = tmp_path / "kernels" / "k.cpp"
    source.write_text('#include <vector>\n#include "../shared.h"  // twice\nint f() { return twice(3); }\n')
    text = cpu_build.read_source(source)
    assert "#include <vector>" in text and "return 2 * x;" in text and '"../shared.h"' not in text.split("\n")[1]
    extension = cpu_build.Extension("test_kernel", source, ("f",), "a test kernel", "nothing")
    before = extension.name()
    header.write_text("inline int twice(int x) { return x + x; }\n")
    assert extension.name() != before  # a header's change rebuilds what includes it
    # the shipped kernels include the shared vector math, and it is installed beside them
    for kernel in (cpu_compiled.EXTENSION, attention_cpu_compiled.EXTENSION):
        assert "inline vfloat exp_vector" in cpu_build.read_source(kernel.source_path)


def test_switched_off_it_says_why(monkeypatch):
    monkeypatch.setenv(cpu_compiled.ENV_SWITCH, "0")
    monkeypatch.setattr(cpu_compiled.EXTENSION, "tried", False)
    monkeypatch.setattr(cpu_compiled.EXTENSION, "module", None)
    monkeypatch.setattr(cpu_compiled.EXTENSION, "reason", None)
    assert cpu_compiled.load() is None
    assert cpu_compiled.unavailable_reason() == f"{cpu_compiled.ENV_SWITCH}=0"
    kernel = cpu.CPUKernel()
    assert kernel.micro is None  # the operators take over
    with pytest.raises(RuntimeError, match="cannot run here"):
        cpu.CPUKernel(microkernel=True)
