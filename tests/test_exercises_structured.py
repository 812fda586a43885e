"""Chapter 11's exercise: the checker passes a correct `choice` mask and names each usual mistake."""

from __future__ import annotations

import pytest

from minilm_engine import LLM
from minilm_engine.course.teaching.exercises_structured import choice_mask_exercise

pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def llm():
    return LLM("noodle-chef", device="cpu", record_trace=False)


def correct(choices, text, pieces, stop_token_ids):
    allowed = {i for i, piece in enumerate(pieces) if piece and any(c.startswith(text + piece) for c in choices)}
    return allowed | set(stop_token_ids) if text in choices else allowed


def test_a_correct_mask_passes(llm) -> None:
    assert choice_mask_exercise.check(correct, llm, num_cases=20).passed


def test_the_usual_mistakes_are_named(llm) -> None:
    no_stop = choice_mask_exercise.check(lambda c, t, p, s: correct(c, t, p, ()), llm, num_cases=30)
    assert not no_stop.passed and "stop token must be allowed" in no_stop.message
    one_char = choice_mask_exercise.check(
        lambda c, t, p, s: {i for i in correct(c, t, p, s) if len(p[i]) == 1 or i in s}, llm, num_cases=30)
    assert not one_char.passed and "several characters" in one_char.message
    always_stop = choice_mask_exercise.check(lambda c, t, p, s: correct(c, t, p, s) | set(s), llm, num_cases=30)
    assert not always_stop.passed and "not a complete choice" in always_stop.message
    assert not choice_mask_exercise.check("not a function", llm).passed
