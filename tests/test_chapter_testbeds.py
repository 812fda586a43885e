"""The testbeds chapters 05 and 06 rest on (course/experiments/spec_testbeds.py, quant_testbeds.py):
each does what its contract says, against a reference or an invariant."""

from __future__ import annotations

import copy

import pytest
import torch

from minilm_engine import LLM, SamplingParams
from minilm_engine.core.spec_decode_stats import SpecDecodingStats
from minilm_engine.course.experiments import quant_testbeds as qt
from minilm_engine.course.experiments import quantization as qx
from minilm_engine.course.experiments import spec_testbeds as st
from minilm_engine.course.experiments.speculative import SpecCostModel
from minilm_engine.model.quantization import QuantizationConfig, schemes


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("group_size", [None, 32])
def test_fake_quantize_is_within_half_a_step_and_uses_its_levels(bits: int, group_size: int | None) -> None:
    w = torch.randn(6, 96, generator=torch.Generator().manual_seed(bits))
    w[2, 5] = 40.0  # an outlier: only its own row (or group) gets the coarse step
    out = qt.fake_quantize_asym(w, bits, group_size)
    g = 96 if group_size is None else group_size
    groups, got = w.view(6, -1, g), out.view(6, -1, g)
    step = (groups.amax(-1) - groups.amin(-1)) / (2**bits - 1)
    assert ((got - groups).abs() <= step[..., None] / 2 + 1e-5).all()
    assert all(len(torch.unique(got[n, j])) <= 2**bits for n in range(6) for j in range(got.shape[1]))
    if bits == 4 and group_size == 32:  # the package's INT4 scheme, same rounding
        scales, offsets = schemes.int4_params(w, 32)
        ref = schemes.dequantize_int4(schemes.quantize_int4(w, scales, offsets, 32), scales, offsets, 96)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_fake_quantize_pads_a_row_that_is_not_a_multiple_of_the_group() -> None:
    w = torch.randn(3, 80)
    out = qt.fake_quantize_asym(w, 4, 32)
    assert out.shape == w.shape and (out - w).abs().max() < (w.max() - w.min()) / 15


def test_sweep_restores_the_weights_and_more_bits_lose_less() -> None:
    llm = LLM("noodle-chef", device="cpu", record_trace=False, kv_cache_memory=8 << 20, model_backend="reference")
    windows = qx.heldout_windows(llm.tokenizer, 8)[:3]
    before = {n: m.weight.clone() for n, m in qt.projections(llm.model).items()}
    assert len(before) == 7 * llm.model.config.num_hidden_layers
    base = qx.window_losses(llm.model, windows)
    sweep = qt.sweep_bits(llm.model, windows, [8, 1], [None])
    assert all(torch.equal(m.weight, before[n]) for n, m in qt.projections(llm.model).items())
    assert qx.window_losses(llm.model, windows) == base
    eight = qt.perplexity_change(base, sweep[(8, None)])
    one = qt.perplexity_change(base, sweep[(1, None)])
    assert abs(eight.value) < 0.1 < one.low  # 1 bit per row ruins it; 8 bits does not


def test_outlier_channels_keep_the_function_and_make_outliers() -> None:
    llm = LLM("noodle-chef", device="cpu", record_trace=False, kv_cache_memory=8 << 20, model_backend="reference")
    windows = qx.heldout_windows(llm.tokenizer, 3)[:1]
    model = copy.deepcopy(llm.model)
    channels = qt.add_outlier_channels(model, num_channels=2, factor=50.0)
    assert len(set(channels)) == 2
    torch.testing.assert_close(torch.tensor(qx.window_losses(model, windows)),
                               torch.tensor(qx.window_losses(llm.model, windows)), atol=1e-4, rtol=0)
    before = qt.channel_magnitudes(llm.model, llm.tokenizer, "model.layers.0.self_attn.q_proj", num_texts=1)
    after = qt.channel_magnitudes(model, llm.tokenizer, "model.layers.0.self_attn.q_proj", num_texts=1)
    torch.testing.assert_close(after[channels], 50.0 * before[channels], rtol=1e-3, atol=1e-5)
    quantized = qt.quantized_copy(model, llm.tokenizer, QuantizationConfig("int8", group_size=None))
    assert sum(1 for m in quantized.modules() if hasattr(m, "kernel")) == len(qt.projections(model))
    assert len(qt.projections(model)) > 0  # the copy was quantized, not the model


def test_pooled_acceptance_is_accepted_over_compared_across_prompts() -> None:
    a, b = SpecDecodingStats(2), SpecDecodingStats(2)
    a.observe(2, 2)  # both kept: 2 compared, 2 accepted
    b.observe(2, 0)  # first rejected: 1 compared
    m = st.pooled_acceptance([a, b])
    assert m.value == pytest.approx(100 * 2 / 3)
    assert st.pooled_stats([a, b]).num_drafts == 2


def test_acceptance_over_prompts_gives_one_counter_per_prompt() -> None:
    llm = LLM("noodle-chef", device="cpu", max_num_seqs=4, record_trace=False,
              speculative_config={"model": "noodle-apprentice", "num_speculative_tokens": 2})
    per = st.acceptance_over_prompts(llm, ["Receipt #1", "Order for table 3:"], SamplingParams(temperature=0, max_tokens=12))
    assert len(per) == 2 and all(s.num_accepted_tokens <= s.num_draft_tokens for s in per)


def test_engine_cost_model_fits_the_round_times() -> None:
    bare = SpecCostModel(draft_step_s=1.0, decode_step_s=10.0, verify_per_token_s=0.5)
    rounds = {k: 12.0 + 3.0 * k for k in range(0, 5)}  # each draft costs 3 in the engine
    fitted = st.engine_cost_model(bare, rounds)
    assert fitted.decode_step_s == pytest.approx(12.0)
    assert fitted.draft_step_s + fitted.verify_per_token_s == pytest.approx(3.0)
    assert all(fitted.round_s(k) == pytest.approx(rounds[k]) for k in rounds)


def test_claims_are_recorded_beside_the_notebooks() -> None:
    """`record` writes where scripts/execute_notebooks.py and the claims test look (the course
    moved under minilm_engine/course/, one folder deeper: a wrong root silently wrote nothing)."""
    from pathlib import Path

    from minilm_engine.course.teaching import claims

    assert claims.CLAIMS_DIR == Path(__file__).resolve().parents[1] / "notebooks" / "claims"
