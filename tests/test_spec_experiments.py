"""Tests for minilm_engine.course.experiments.speculative: the chapter's measurements on tiny models.

Timings are not checked (noise); what is checked is that every run reports what it promises:
the same tokens as without speculation, counters that add up, the formula evaluated at the
measured alpha, and a sampled distribution that a chi-square test cannot tell from the target's.
"""

from __future__ import annotations

import pytest

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.experiments import speculative
from minilm_engine.worker.spec_decode import expected_tokens_per_round

from test_spec_decode_engine import drafts  # noqa: F401  (the perturbed-copy drafts fixture)


def test_measure_speculation_reports_same_tokens_and_the_formula(checkpoints, drafts, monkeypatch):
    monkeypatch.setattr(speculative, "sample_prompts", lambda n, seed=0: ["Hello", "Order for table 7:", "A bowl"][:n] * (n // 3 + 1))
    runs = speculative.measure_speculation(
        str(checkpoints["qwen3"].path), str(drafts["qwen3"]), num_speculative_tokens=(1, 3),
        batch_sizes=(1, 2), max_tokens=12, num_prompts=2, num_repeats=1, min_pairs=2, device="cpu",
    )
    assert [(r.batch_size, r.num_speculative_tokens) for r in runs] == [(1, 0), (1, 1), (1, 3), (2, 0), (2, 1), (2, 3)]
    assert all(r.same_tokens and r.tokens_per_s > 0 for r in runs)
    speculating = [r for r in runs if r.num_speculative_tokens]
    assert all(r.stats.num_drafts > 0 for r in speculating)
    # Fewer target forwards than tokens, with speculation; one per token (plus the prefill) without.
    assert all(r.num_target_forwards < r.num_output_tokens for r in speculating)
    table = speculative.tokens_per_forward_table(runs)
    for row in table:
        assert row["formula_tokens_per_round"] == pytest.approx(expected_tokens_per_round(row["alpha"], row["K"]))
    assert {r["speedup"] for r in speculative.speedup_table(runs) if r["K"] == 0} == {1.0}
    # The same two prompts at both batch sizes: two timed batches of one at batch 1, and the one
    # batch of two repeated to reach min_pairs; speedups pair unit with unit.
    assert all(len(r.unit_seconds) == len(r.unit_tokens) == 2 for r in runs)
    assert [sum(r.unit_tokens) for r in runs if r.batch_size == 1] == [r.num_output_tokens for r in runs if r.batch_size == 1]
    assert {r.num_output_tokens for r in runs} == {runs[0].num_output_tokens}
    assert len(speculative.paired_speedups(runs, 2, 3)) == 2 and speculative.paired_speedups(runs, 1, 0) == [1.0, 1.0]
    assert len(speculative.speedup_figure(runs).data) > 0 and len(speculative.tokens_per_round_figure(runs).data) == 3


def test_time_verify_forward_times_every_length(checkpoints):
    model = LLM(checkpoints["llama"].path, max_model_len=64).model
    times = speculative.time_verify_forward(model, [1, 3, 5], batch_size=2, context_len=16, num_repeats=2)
    assert list(times) == [1, 3, 5] and all(t > 0 for t in times.values())


def test_check_sampled_distribution_agrees_with_the_target(checkpoints, drafts):
    llm = LLM(checkpoints["qwen2"].path, max_model_len=64, max_num_seqs=32, record_trace=False,
              speculative_config={"model": str(drafts["qwen2"]), "num_speculative_tokens": 2})
    check = speculative.check_sampled_distribution(
        llm, [3, 4, 5], SamplingParams(temperature=1.2, top_k=2, max_tokens=3, ignore_eos=True), num_samples=400)
    # Tokens 2 and 3 come from one round with one draft (max_tokens leaves room for no more).
    assert check.num_outcomes == 8 and check.num_outside == 0
    assert check.p_value > 1e-3 and 0 < check.draft_acceptance_rate <= 1


def test_cost_model_fits_a_line_and_picks_k():
    model = speculative.SpecCostModel.fit(draft_step_s=0.1, verify_times={1: 1.0, 3: 1.4, 5: 1.8})
    assert model.decode_step_s == pytest.approx(1.0) and model.verify_per_token_s == pytest.approx(0.2)
    assert model.round_s(3) == pytest.approx(3 * 0.1 + 1.0 + 3 * 0.2)
    assert model.speedup(0.8, 3) == pytest.approx(expected_tokens_per_round(0.8, 3) / 1.9)
    # A better draft is worth more drafts; a perfect one, as many as allowed.
    assert model.best_k(0.5) < model.best_k(0.9) <= model.best_k(1.0, max_k=8) == 8
