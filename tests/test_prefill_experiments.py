"""Tests for minilm_engine.course.experiments.prefill (chapter 04): the cost model exactly, the fit on
synthetic data, and the engine-driven measurements on the shipped noodle-apprentice."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minilm_engine import LLM
from minilm_engine.course.noodle_corpus import sample_prompts
from minilm_engine.course.experiments import prefill
from minilm_engine.model.config import ModelConfig
from minilm_engine.course.teaching.exercises_paging import engine_prefill_chunks

MODEL = "noodle-apprentice"
CHEF_LIKE = ModelConfig(
    model_type="llama", vocab_size=1497, hidden_size=320, intermediate_size=896,
    num_hidden_layers=6, num_attention_heads=5, num_key_value_heads=1, head_dim=64,
    max_position_embeddings=1024, tie_word_embeddings=True,
)


# -- cost model ------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
def test_matmul_parameters_are_the_model_without_embeddings_and_norms(tied: bool) -> None:
    config = ModelConfig(**{**CHEF_LIKE.__dict__, "tie_word_embeddings": tied})
    h, num_layers = config.hidden_size, config.num_hidden_layers
    embeddings = config.vocab_size * h * (1 if tied else 2)
    norms = num_layers * 2 * h + h
    assert prefill.matmul_parameters(config) + embeddings + norms == config.num_parameters()


def test_prefill_flops_and_crossover() -> None:
    p = prefill.matmul_parameters(CHEF_LIKE)
    assert p == 6 * (320 * 320 + 2 * 320 * 64 + 320 * 320 + 3 * 320 * 896) == 6_635_520
    f = prefill.prefill_flops(CHEF_LIKE, 1000)
    assert f.linear == 2 * p * 1000
    assert f.attention == 4 * 6 * 5 * 64 * 1000**2
    assert f.total == f.linear + f.attention
    t_star = prefill.attention_crossover_tokens(CHEF_LIKE)
    assert t_star == 1728.0
    at = prefill.prefill_flops(CHEF_LIKE, int(t_star))
    assert at.attention == pytest.approx(at.linear)
    assert at.attention_fraction == pytest.approx(0.5)
    # A causal kernel computes half the square: T* doubles, and is again where the two are equal.
    causal = prefill.attention_crossover_tokens(CHEF_LIKE, causal=True)
    assert causal == 2 * t_star
    at = prefill.prefill_flops(CHEF_LIKE, int(causal), causal=True)
    assert at.attention == pytest.approx(at.linear)


# -- the fit ---------------------------------------------------------------------------------


def test_fit_recovers_exact_coefficients() -> None:
    t = np.array([16, 64, 256, 512, 768, 1000.0])
    fit = prefill.fit_prefill_cost(t, 0.012 + 1e-4 * t + 3e-7 * t**2)
    assert fit.fixed == pytest.approx(0.012)
    assert fit.linear == pytest.approx(1e-4)
    assert fit.quadratic == pytest.approx(3e-7)
    assert fit.crossover_tokens == pytest.approx(1e-4 / 3e-7)
    assert fit.quadratic_fraction(fit.crossover_tokens) == pytest.approx(0.5)
    assert fit.predict(100.0) == pytest.approx(0.012 + 1e-2 + 3e-3)


def test_fit_never_returns_negative_terms() -> None:
    t = np.array([16, 64, 256, 512, 768, 1000.0])
    # A noisy curve whose unconstrained fit has a negative linear term.
    y = np.array([16.53, 26.85, 45.76, 120.56, 325.18, 535.02]) / 1e3
    fit = prefill.fit_prefill_cost(t, y)
    assert min(fit.fixed, fit.linear, fit.quadratic) >= 0
    assert fit.crossover_tokens == 0.0  # no linear term: T^2 everywhere
    linear_only = prefill.fit_prefill_cost(t, 0.01 + 2e-4 * t)
    assert linear_only.quadratic == pytest.approx(0, abs=1e-15)
    assert linear_only.crossover_tokens is None or linear_only.crossover_tokens > 1e6
    with pytest.raises(ValueError):
        prefill.fit_prefill_cost([1, 2], [0.1, 0.2])


# -- engine-driven ---------------------------------------------------------------------------


def test_corpus_token_ids_is_deterministic_and_exact() -> None:
    tokenizer = LLM(MODEL).tokenizer
    ids = prefill.corpus_token_ids(tokenizer, 900, seed=7)
    assert len(ids) == 900
    assert ids == prefill.corpus_token_ids(tokenizer, 900, seed=7)
    assert ids[:100] == prefill.corpus_token_ids(tokenizer, 100, seed=7)


def test_time_prefill_times_one_whole_prompt_per_step() -> None:
    llm = LLM(MODEL, max_model_len=256, enable_chunked_prefill=False, max_num_batched_tokens=256)
    times = prefill.time_prefill(llm, [8, 64], num_repeats=2)
    assert times["num_tokens"].tolist() == [8, 64, 8, 64]
    assert (times["seconds"] > 0).all()
    assert not llm.engine.has_unfinished_requests()
    # The prefix cache was emptied each time: every prompt was computed in full.
    assert [r.num_prefill_tokens for r in llm.engine.trace.records] == [8, 64, 8, 64]
    with pytest.raises(ValueError, match="do not fit one step"):
        prefill.time_prefill(llm, [300])


@pytest.mark.parametrize("chunked", [True, False])
def test_long_prompt_interference(chunked: bool) -> None:
    budget = 32 if chunked else 256
    llm = LLM(MODEL, max_model_len=256, enable_chunked_prefill=chunked,
              max_num_batched_tokens=budget, enable_prefix_caching=False)
    long_ids = prefill.corpus_token_ids(llm.tokenizer, 100, seed=7)
    streams = sample_prompts(3, seed=1)
    result = prefill.long_prompt_interference(
        llm, streams, long_ids, num_stream_tokens=20, inject_after_steps=5, label="x"
    )
    assert len(result.itl) == 3 * 19  # one gap per streamed token after the first
    assert result.num_long_prompt_tokens == 100
    assert result.baseline_itl_s > 0 and result.worst_itl_s > 0
    assert math.isclose(result.stall_ratio, result.worst_itl_s / result.baseline_itl_s)
    assert result.long_ttft_s > 0
    assert (result.itl["time_s"] < 0).any() and (result.itl["time_s"] >= 0).any()
    chunks = [
        c.num_prefill_tokens for rec in llm.engine.trace.records for c in rec.chunks
        if c.request_id.endswith("-long") and c.num_prefill_tokens
    ]
    assert chunks == (engine_prefill_chunks(100, 3, budget) if chunked else [100])
    assert len(result.steps) == len(llm.engine.trace.records)
    with pytest.raises(ValueError, match="inject_after_steps"):
        prefill.long_prompt_interference(llm, streams, long_ids, 5, 5)


def test_figures_build() -> None:
    pytest.importorskip("plotly")
    t = np.array([16, 64, 256, 1000.0])
    fit = prefill.fit_prefill_cost(t, 0.01 + 1e-4 * t + 1e-7 * t**2)
    fig = prefill.prefill_cost_figure(t, 0.01 + 1e-4 * t, fit, CHEF_LIKE)
    assert len(fig.data) == 5
    llm = LLM(MODEL, max_model_len=256, max_num_batched_tokens=32, enable_prefix_caching=False)
    result = prefill.long_prompt_interference(
        llm, sample_prompts(2, seed=1), list(range(1, 60)), num_stream_tokens=8,
        inject_after_steps=2,
    )
    assert len(prefill.itl_figure([result, result]).data) == 4


def test_modelled_prefill_is_flat_to_its_ridge_then_linear() -> None:
    from minilm_engine.course.experiments import prefill_views

    weight_bytes, bandwidth, flops = 4e8, 2e10, 1e11  # 20 ms to read the weights
    ridge = prefill_views.prefill_ridge_tokens(CHEF_LIKE, weight_bytes, bandwidth, flops)
    read_s = weight_bytes / bandwidth
    at = lambda t: prefill_views.modelled_prefill_s(CHEF_LIKE, t, weight_bytes, bandwidth, flops)  # noqa: E731
    assert at(1) == at(ridge - 1) == read_s  # below the ridge the read sets the time
    assert at(ridge) > read_s and prefill.prefill_flops(CHEF_LIKE, ridge, causal=True).total / flops == at(ridge)
    assert prefill.prefill_flops(CHEF_LIKE, ridge - 1, causal=True).total / flops < read_s


def test_chunk_steps_follow_the_prefix_and_the_figures_build() -> None:
    pytest.importorskip("plotly")
    from minilm_engine.course.experiments import prefill_views
    from minilm_engine.course.teaching.claims import Measurement

    llm = LLM(MODEL, max_model_len=256, enable_chunked_prefill=True, max_num_batched_tokens=32,
              enable_prefix_caching=False)
    long_ids = prefill.corpus_token_ids(llm.tokenizer, 100, seed=7)
    result = prefill.long_prompt_interference(llm, sample_prompts(3, seed=1), long_ids, num_stream_tokens=20,
                                              inject_after_steps=5)
    chunks = prefill_views.chunk_steps(llm.engine.trace.records)
    assert chunks.chunk_tokens.tolist() == engine_prefill_chunks(100, 3, 32)
    assert chunks.keys_attended.tolist() == list(np.cumsum(chunks.chunk_tokens))
    assert (chunks.num_decode_tokens == 3).all() and (chunks.duration_s > 0).all()
    assert len(prefill_views.chunk_steps_figure(chunks.assign(round=0), 0.01).data) == 3
    lengths = [1, 8, 64]
    measured = [Measurement.from_samples([1.0, 1.1, 0.9], unit="x") for _ in lengths]
    machine = dict(name="m", weight_bytes=4e8, read_bandwidth=2e10, matmul_flops=1e11, source="a datasheet, 2026")
    assert len(prefill_views.prefill_in_steps_figure(lengths, measured, CHEF_LIKE, machine, machine).data) == 3
    sweep = [{"max_num_batched_tokens": b, "p99_itl_s": 0.01 * b, "mean_itl_s": 0.005, "long_ttft_s": 1 / b}
             for b in (4, 16, 64)]
    assert len(prefill_views.budget_sweep_figure(sweep, 0.1, 3).data) == 4
    assert result.num_long_prompt_tokens == 100
