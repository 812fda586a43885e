"""The drill bank and chapter 09's quiz: 160+ questions, 40%+ numeric, numeric answers computed
from real shapes and quoted rates (a few pinned to hand-computed numbers), links that resolve to
a notebook heading, quiz draws, grading, mock interview, export."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import nbformat
import numpy as np
import pytest

from minilm_engine.course.known_configs import known_config
from minilm_engine.course.teaching.drills import (
    DRILLS_DIR,
    FORMULAS,
    KINDS,
    export_markdown,
    load_drills,
    parse_number,
)
from minilm_engine.course.teaching.quiz import Quiz, render_text
from minilm_engine.course.teaching.serving_math import MOE_SHAPES, expected_distinct, tree_num_nodes

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _headings(notebook: Path) -> set[str]:
    nb = nbformat.read(notebook, as_version=4)
    return {line.lstrip("#").strip() for c in nb.cells if c.cell_type == "markdown"
            for line in c.source.splitlines() if line.startswith("#")}


def test_the_bank_has_160_questions_of_every_kind_40_percent_numeric() -> None:
    bank = load_drills()
    assert len(bank) >= 160
    assert sum(d.kind == "numeric" for d in bank) >= 0.4 * len(bank)
    assert set(Counter(d.kind for d in bank)) == set(KINDS)
    assert {d.difficulty for d in bank} == {1, 2, 3}
    assert len({d.question for d in bank}) == len(bank), "a question appears twice"


def test_every_link_resolves_to_a_notebook_heading() -> None:
    """Drills of a chapter whose notebook is not there would fail here: a chapter's bank comes
    with its notebook."""
    for drill in load_drills():
        notebook = NOTEBOOKS / drill.notebook
        assert notebook.exists(), f"{drill.source}: {drill.link} (no such notebook)"
        assert drill.heading in _headings(notebook), f"{drill.source}: no heading {drill.heading!r} in {drill.notebook}"


def test_numeric_answers_are_computed_not_typed() -> None:
    for file in DRILLS_DIR.glob("*.json"):
        for item in json.loads(file.read_text()):
            assert "value" not in item, f"{file.name}: numeric values are computed, not typed"
            if item.get("kind") == "numeric":
                assert item["compute"]["formula"] in FORMULAS
    by_question = {d.question: d for d in load_drills(kind="numeric")}
    llama3 = known_config("Meta-Llama-3-8B")
    drill = by_question["How many KiB of KV cache does one token take in Llama-3-8B in bf16?"]
    assert drill.value == llama3.kv_bytes_per_token(2) / 1024 == 128
    # The claim: 32 Llama-3-8B requests at 4K read about as much KV as the weights.
    ratio = FORMULAS["kv_over_weights"](model="Meta-Llama-3-8B", batch=32, context=4096)
    assert 1.0 < ratio < 1.1
    # Batching is nearly free at short context, not at long context (chapter 01's model).
    short = FORMULAS["step_ratio"](model="Meta-Llama-3-8B", gpu="H100", batch=32, context=512)
    long = FORMULAS["step_ratio"](model="Meta-Llama-3-8B", gpu="H100", batch=32, context=32768)
    assert short < 1.2 < 5 < long


def test_numeric_grading_with_a_tolerance() -> None:
    drill = next(d for d in load_drills(kind="numeric") if d.unit == "KiB")
    assert drill.check(f"{drill.value}") and drill.check(f"about {drill.value * 1.03:,.1f} KiB")
    assert not drill.check(str(drill.value * 2)) and not drill.check("no idea")
    assert parse_number("1,024.5 GiB") == 1024.5 and parse_number("3e9") == 3e9
    assert next(d for d in load_drills(kind="concept")).check("42") is None


def test_quiz_draws_by_chapter_and_difficulty_and_keeps_score() -> None:
    quiz = Quiz(seed=3)
    seen = {quiz.draw(chapter="02", difficulty=1).question for _ in range(4)}
    assert all(d.chapter == "02" and d.difficulty == 1 for d in quiz.matching("02", 1))
    assert len(seen) == min(4, len(quiz.matching("02", 1))), "no repeats while fresh ones remain"
    numeric = next(d for d in quiz.drills if d.value is not None)
    quiz.current, quiz._graded = numeric, False
    assert quiz.answer(numeric.value).correct and str(quiz.score) == "1 / 1 correct"
    quiz.answer("0")  # a second answer to the same draw does not count again
    assert quiz.score.num_asked == 1
    concept = quiz.draw(chapter="00", difficulty=None)
    if concept.value is None:
        assert quiz.answer("whatever").correct is None
        quiz.self_grade(False)
        assert str(quiz.score) == "1 / 2 correct"
    with pytest.raises(ValueError, match="no drill"):
        quiz.draw(chapter="99")


def test_mock_interview_and_the_headless_fallback(capsys) -> None:
    quiz = Quiz(seed=0)
    mock = quiz.mock_interview(num_questions=5, minutes=10, seed=2)
    assert len(mock.drills) == 5 and mock.remaining_s > 0
    for d in mock.drills:
        mock.answer(d.value) if d.value is not None else mock.answer(correct=False)
    assert mock.finish().startswith(f"{sum(1 for d in mock.drills if d.value is not None)} / 5 correct")
    with pytest.raises(RuntimeError, match="over"):
        mock.answer("1")
    mock.print_sheet()  # the questions only: the sheet must not give the answers away
    sheet = capsys.readouterr().out
    assert sheet.count("\nQ") == 5 and "A1." not in sheet
    assert not any(d.answer[:40] in sheet for d in mock.drills)
    mock.print_answers()
    answers = capsys.readouterr().out
    assert all(f"A{i}. {d.answer}" in answers for i, d in enumerate(mock.drills, 1))
    quiz.show(num_questions=2)  # no kernel here: prints questions with answers
    out = capsys.readouterr().out
    assert out.count("[chapter ") == 2 and "\nA: " in out
    assert "measured in" in render_text(mock.drills[0])


def test_export_markdown(tmp_path) -> None:
    text = export_markdown(tmp_path / "bank.md")
    assert (tmp_path / "bank.md").read_text() == text
    assert text.count("**Model answer.**") == len(load_drills())
    assert "## Chapter 02" in text and "](02_kv_cache.ipynb#" in text


def test_the_widget_builds_and_grades() -> None:
    pytest.importorskip("ipywidgets")
    quiz = Quiz(seed=1)
    box = quiz.widget()
    top, question, row, feedback = box.children
    chapter, difficulty, draw, score = top.children
    chapter.value, difficulty.value = "01", 3
    draw.click()
    assert quiz.current.chapter == "01" and quiz.current.difficulty == 3
    answer, check, reveal, had_it, missed = row.children
    if quiz.current.value is not None:
        answer.value = str(quiz.current.value)
        check.click()
        assert "Correct" in feedback.value and "1 / 1" in score.value
    else:
        reveal.click()
        had_it.click()
        assert "Model answer" in feedback.value and "1 / 1" in score.value


def test_the_mock_interview_widget_walks_the_set() -> None:
    pytest.importorskip("ipywidgets")
    from minilm_engine.course.teaching.quiz_widget import mock_widget

    mock = Quiz(seed=0).mock_interview(num_questions=3, minutes=5, seed=4)
    box = mock_widget(mock)
    header, question, row, feedback = box.children
    answer, submit, had_it, missed = row.children
    assert "question 1 of 3" in header.value and "left" in header.value
    for drill in list(mock.drills):
        if drill.value is not None:
            answer.value = str(drill.value)
            submit.click()
        else:
            had_it.click()
        assert "Model answer to the last one" in feedback.value
    assert mock.finish().startswith("3 / 3 correct") and "3 / 3 correct" in question.value
    assert submit.disabled and had_it.disabled


# Issue 18's interview topics, each asked with a computed answer somewhere in the bank.
SERVING_TOPICS = {
    "all-reduce cost": "ring_allreduce_ms", "tensor parallelism": "tp_allreduce_ms_per_step",
    "pipeline parallelism": "pipeline_bubble_pct", "expert parallelism": "ep_all_to_all_mb",
    "MoE active vs total": "moe_parameters_b", "MoE experts read per step": "moe_step_read_gib",
    "FP8 / W8A8": "crossover_batch", "SmoothQuant": "smoothquant_scale", "Marlin": "w4a16_speedup",
    "speculation with draft cost": "spec_speedup", "EAGLE trees": "tree_tokens_per_step",
    "batch-invariant numerics": "bf16_spacing", "Little's law": "littles_concurrency",
    "MBU": "mbu_pct", "MFU": "mfu_pct", "prefix-aware routing": "prefix_hit_pct",
    "autoscaling": "replicas_for_load", "multi-LoRA": "lora_mib",
}


def test_the_bank_asks_every_serving_topic_with_a_number() -> None:
    used = {item["compute"]["formula"] for file in DRILLS_DIR.glob("*.json")
            for item in json.loads(file.read_text()) if "compute" in item}
    missing = {topic for topic, formula in SERVING_TOPICS.items() if formula not in used}
    assert not missing, f"no numeric drill for {missing}"


def test_serving_formulas_against_hand_computed_numbers() -> None:
    # Ring all-reduce of 1 GiB over 8 GPUs at 450 GB/s: 2 x 7/8 x 2^30 B / 450e9 B/s.
    assert FORMULAS["ring_allreduce_ms"](gib=1, num_gpus=8, link="NVLink4") == pytest.approx(1.75 * 2**30 / 450e9 * 1e3)
    # Mixtral-8x7B: the paper's "47B parameters ... 13B active" (arXiv:2401.04088).
    assert round(FORMULAS["moe_parameters_b"](moe="Mixtral-8x7B", which="total")) == 47
    assert round(FORMULAS["moe_parameters_b"](moe="Mixtral-8x7B", which="active")) == 13
    # At batch 1 a step reads the active parameters, at a large batch all of them.
    one = FORMULAS["moe_step_read_gib"](moe="Mixtral-8x7B", batch=1)
    assert one == pytest.approx(FORMULAS["moe_parameters_b"](moe="Mixtral-8x7B", which="active") * 2e9 / 2**30)
    assert FORMULAS["moe_step_read_gib"](moe="Mixtral-8x7B", batch=256) == pytest.approx(
        FORMULAS["moe_weights_gib"](moe="Mixtral-8x7B"))
    # Rank-16 LoRA on Llama-3-8B's q/k/v/o: 16 x (8192 + 5120 + 5120 + 8192) x 32 layers x 2 B = 26 MiB.
    lora = FORMULAS["lora_mib"](model="Meta-Llama-3-8B", rank=16, modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    assert lora == 16 * (8192 + 5120 + 5120 + 8192) * 32 * 2 / 2**20 == 26
    # Llama-3-70B KV of one 8K sequence is 2.5 GiB; 4 H100s at 0.9 hold (288 - weights) / 2.5 of them.
    weights_gib = FORMULAS["weights_gib"](model="Meta-Llama-3-70B")
    assert FORMULAS["max_sequences_tp"](model="Meta-Llama-3-70B", gpu="H100", tp=4, context=8192) == (288 - weights_gib) // 2.5
    # W4A16 at batch 1 reads 0.5 + 2/128 bytes per weight instead of 2: 3.88x, and no gain at a big batch.
    assert FORMULAS["w4a16_speedup"](gpu="A100", batch=1) == pytest.approx(2 / 0.515625)
    assert FORMULAS["w4a16_speedup"](gpu="A100", batch=4096) == pytest.approx(1.0)
    # FP8 halves the bytes and doubles the FLOP rate: the ridge batch is bf16's.
    assert FORMULAS["crossover_batch"](gpu="H100", bytes_per_element=1, precision="fp8") == pytest.approx(
        FORMULAS["crossover_batch"](gpu="H100"), rel=0.01)
    # SmoothQuant with alpha 0.5 equalises the two maxima at sqrt(64 x 0.5).
    assert FORMULAS["smoothed_act_max"](act_max=64, weight_max=0.5) == pytest.approx(32**0.5)
    assert FORMULAS["bf16_spacing"](x=12.0) == 2**-4 and FORMULAS["bf16_spacing"](x=1.0) == 2**-7
    assert FORMULAS["littles_concurrency"](rate_per_s=20, ttft_s=0.5, output_tokens=300, tpot_ms=25) == 160
    assert FORMULAS["replicas_for_load"](rate_per_s=50, output_tokens=400, replica_tokens_per_s=2500,
                                         target_utilization=0.7) == 12
    assert FORMULAS["pipeline_bubble_pct"](stages=4, microbatches=8) == pytest.approx(300 / 11)
    assert FORMULAS["mbu_pct"](model="Meta-Llama-3-8B", gpu="H100", tpot_ms=7, batch=1, context=1024) == pytest.approx(
        100 * (known_config("Meta-Llama-3-8B").num_parameters() * 2 + 1024 * 131072) / 7e-3 / 3.35e12)


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.9])
def test_a_tree_of_width_one_is_a_chain_and_width_helps(alpha) -> None:
    chain = FORMULAS["tokens_per_round"](alpha=alpha, k=4)
    assert FORMULAS["tree_tokens_per_step"](alpha=alpha, widths=[1, 1, 1, 1]) == pytest.approx(chain)
    assert FORMULAS["tree_tokens_per_step"](alpha=alpha, widths=[3, 2, 1, 1]) > chain
    assert tree_num_nodes([4, 2, 2, 1, 1]) == 4 + 8 + 16 + 16 + 16


def test_the_break_even_acceptance_and_the_best_k() -> None:
    alpha = FORMULAS["spec_break_even_alpha"](k=4, draft_cost=0.2)
    assert FORMULAS["spec_speedup"](alpha=alpha, k=4, draft_cost=0.2) == pytest.approx(1.0, abs=1e-6)
    # By hand: (1 - 0.8^9) / 0.2 / 1.4 = 3.09 beats K = 7 (3.08) and K = 9 (3.08).
    assert FORMULAS["spec_best_k"](alpha=0.8, draft_cost=0.05) == 8


def test_expected_distinct_matches_a_simulation() -> None:
    """Distinct experts a batch touches and replicas a shared prefix lands on, by sampling."""
    rng = np.random.default_rng(0)
    experts, top_k = MOE_SHAPES["Mixtral-8x7B"]["num_experts"], MOE_SHAPES["Mixtral-8x7B"]["top_k"]
    touched = [len({e for _ in range(8) for e in rng.choice(experts, top_k, replace=False)}) for _ in range(4000)]
    assert np.mean(touched) == pytest.approx(FORMULAS["experts_touched"](moe="Mixtral-8x7B", batch=8), rel=0.02)
    replicas = [len(set(rng.integers(0, 8, size=20))) for _ in range(4000)]
    assert np.mean(replicas) == pytest.approx(expected_distinct(8, 20), rel=0.02)


def test_queueing_and_sampling_formulas_against_hand_computed_numbers() -> None:
    from minilm_engine.course.teaching import drill_math as dm

    # M/M/1: P(wait) = rho, Wq = rho / (mu - lambda); M/M/2 with a = 1: C = 1/3 (by hand).
    assert dm.erlang_c(1, 0.5) == pytest.approx(0.5)
    assert dm.mmc_wait_s(0.9, 1.0, 1) == pytest.approx(9.0)
    assert dm.erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert dm.mmc_wait_s(8, 1.0, 8) == float("inf")
    # the rate found for a target wait meets it, and a bit more does not
    rate = dm.mmc_max_rate(1.0, 8, 0.1)
    assert dm.mmc_wait_s(rate, 1.0, 8) <= 0.1 < dm.mmc_wait_s(rate * 1.01, 1.0, 8)
    # pooling: more servers reach a higher utilisation at the same wait
    assert dm.mmc_max_rate(1.0, 64, 0.1) / 64 > rate / 8
    assert dm.tail_samples(99, 10) == pytest.approx(1000)
    assert dm.max_exceeds_pct(99, 100) == pytest.approx(100 * (1 - 0.99**100))
    assert dm.scaled_bits(4, 8, 16) == 4.5 and dm.scaled_bits(4, 8, 32) == 4.25
    assert dm.accuracy_ci_pts(50, 10_000) == pytest.approx(0.98)
    assert dm.spot_cost(1.0, 0.5, 60) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        dm.spot_cost(1.0, 1.0, 60)


def test_the_bank_asks_the_interview_topics_chapter_09_derives() -> None:
    """Each of chapter 09's worked derivations is followed by drills that link to it, numeric
    ones among them where the topic has a number."""
    bank = load_drills()
    topics = {"Measuring latency: samples and coordinated omission": 3, "Queueing: M/M/c and utilisation headroom": 3,
              "Speculative decoding: how many tokens to draft": 3, "Quantization: what a format costs and what it loses": 5,
              "Cost: long contexts, reserved and spot capacity": 2, "Design: serving a rate at an SLO": 2}
    headings = _headings(NOTEBOOKS / "09_interview_drills.ipynb")
    for heading, at_least in topics.items():
        assert heading in headings
        linked = [d for d in bank if d.heading == heading]
        assert len(linked) >= at_least, heading
        assert any(d.value is not None for d in linked), heading
    text = " ".join(d.question + " " + d.answer for d in bank).lower()
    for topic in ("coordinated omission", "erlang", "eagle-3", "temperature", "w4a4", "fp8", "nvfp4", "mxfp4",
                  "gptq", "gsm8k", "long-context", "spot", "admission control", "shedding", "fairness"):
        assert topic in text, topic


def test_the_context_drill_says_concurrency_does_not_cap_one_request() -> None:
    drill = next(d for d in load_drills("10") if d.unit == "tokens" and "128 requests" in d.question)
    assert "does not lower it" in drill.answer and "81,559 MiB" in drill.question
    assert drill.value == FORMULAS["context_per_request"](model="Meta-Llama-3-8B", memory_gb=85.52, concurrency=128)
