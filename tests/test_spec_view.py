"""Tests for minilm_engine.course.viz.spec_view: the picture of each round matches the engine's trace.

A tiny random target drafts with a perturbed copy of itself (some drafts accepted, some not).
The figure's cells are read back and recounted against the trace and the engine's counters:
as many accepted cells as accepted tokens, one rejected cell per round that did not accept all,
one target cell (correction or bonus) per round.
"""

from __future__ import annotations

import pytest

from minilm_engine import LLM, SamplingParams
from minilm_engine.course import viz
from minilm_engine.course.viz.spec_view import KIND_COLORS

from conftest import build_hf_model, hf_config, save_checkpoint
from test_spec_decode_engine import perturbed_copy


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tokenizer):
    config = hf_config("llama", len(tokenizer), tokenizer.eos_token_id, hidden_size=32,
                       num_attention_heads=4, num_key_value_heads=4)
    root = tmp_path_factory.mktemp("spec_view")
    model = build_hf_model("llama", config)
    target = save_checkpoint(root / "target", model, tokenizer)
    draft = perturbed_copy(model, root / "draft", tokenizer, noise=0.01)
    llm = LLM(target, max_model_len=64, block_size=4,
              speculative_config={"model": str(draft), "num_speculative_tokens": 3})
    engine = llm.engine
    for i in range(3):
        engine.add_request(f"r{i}", {"prompt_token_ids": [5 + i, 6, 7, 8]}, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return engine


def test_cells_match_the_trace_and_the_counters(engine):
    fig = viz.SpecView(engine).figure()
    kinds = list(KIND_COLORS)
    counts = {kind: len(fig.data[i].y) for i, kind in enumerate(kinds)}
    stats = engine.spec_decoding_stats
    assert counts["accepted"] == stats.num_accepted_tokens > 0
    assert counts["accepted"] + counts["rejected"] + counts["unread"] == stats.num_draft_tokens
    assert counts["correction"] + counts["bonus"] == stats.num_drafts
    assert counts["rejected"] == counts["correction"] > 0  # one rejection per corrected round
    assert counts["prefill"] == 3  # one prompt each
    rounds = [c for r in engine.trace.records for c in r.chunks if c.num_draft_tokens]
    assert counts["bonus"] == sum(c.num_accepted_tokens == c.num_draft_tokens for c in rounds)
    # The running acceptance rate ends at the engine's total.
    assert fig.data[7].y[-1] == pytest.approx(stats.draft_acceptance_rate)
    assert f"{stats.num_accepted_tokens} of {stats.num_draft_tokens} drafts accepted" in fig.layout.title.text


def test_widget_and_static_modes(engine, monkeypatch):
    view = viz.SpecView(engine)
    box = view.widget()
    assert len(box.children[1].data) == len(view.figure().data)
    view.redraw()  # copying a fresh figure into the widget keeps the trace layout
    view.close()
    monkeypatch.setenv("MINILM_STATIC_FIGURES", "1")
    assert viz.default_mode() == "static"


def test_refuses_an_engine_that_does_not_speculate(tokenizer, tmp_path):
    config = hf_config("llama", len(tokenizer), tokenizer.eos_token_id, hidden_size=32,
                       num_attention_heads=4, num_key_value_heads=4)
    folder = save_checkpoint(tmp_path / "m", build_hf_model("llama", config), tokenizer)
    with pytest.raises(ValueError, match="does not speculate"):
        viz.SpecView(LLM(folder, max_model_len=64).engine)
