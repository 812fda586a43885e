"""The drill bank and chapter 09's quiz: 80+ questions, numeric answers computed from real
shapes, links that resolve to a notebook heading, quiz draws, grading, mock interview, export."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import nbformat
import pytest

from minilm_engine.models.known_configs import known_config
from minilm_engine.teaching.drills import DRILLS_DIR, FORMULAS, KINDS, export_markdown, load_drills, parse_number
from minilm_engine.teaching.quiz import Quiz, render_text

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _headings(notebook: Path) -> set[str]:
    nb = nbformat.read(notebook, as_version=4)
    return {line.lstrip("#").strip() for c in nb.cells if c.cell_type == "markdown"
            for line in c.source.splitlines() if line.startswith("#")}


def test_the_bank_has_80_questions_of_every_kind() -> None:
    bank = load_drills()
    assert len(bank) >= 80
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
    mock.print_sheet()
    quiz.show(num_questions=2)  # no kernel here: prints questions with answers
    out = capsys.readouterr().out
    assert "Model answers" in out and out.count("[chapter ") == 2 and "\nA: " in out
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
    from minilm_engine.teaching.quiz_widget import mock_widget

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
