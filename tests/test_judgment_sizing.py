"""Tests for course/teaching/judgment_sizing.py: the stored cases are the script's, a right answer
passes, and each usual mistake fails with its own feedback."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from minilm_engine.course.experiments.batching import DecodeTiming
from minilm_engine.course.teaching import judgment_sizing as sizing

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("make_sizing_cases", ROOT / "scripts" / "make_sizing_cases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _size(case, slo_key="p99_step_ms", step_key="mean_step_ms", flat=False, prefill=True, rounding=math.ceil):
    fits = [r.batch for r in case.steps if getattr(r, slo_key) <= case.p99_tpot_ms]
    batch = max(r.batch for r in case.steps) if flat else max(fits)
    row = next(r for r in case.steps if r.batch == (1 if flat else batch))
    ms_per_request = case.output_tokens * getattr(row, step_key) / batch
    if prefill:
        ms_per_request += case.prompt_tokens * case.prefill_ms_per_token
    return batch, int(rounding(case.requests_per_s * ms_per_request / 1e3 - 1e-9))


def test_the_stored_cases_are_the_scripts_answers():
    stored = json.loads(sizing.FIXTURE.read_text())
    assert _script().build(stored["table"]) == stored


def test_every_stored_mistake_has_feedback_and_every_case_a_wrong_mistake():
    stored = json.loads(sizing.FIXTURE.read_text())
    for case in stored["cases"]:
        assert case["mistakes"] and set(case["mistakes"]) <= set(sizing.MISTAKES)
        assert all(a != case["expected"] for a in case["mistakes"].values())


def test_a_right_answer_passes():
    result = sizing.check(_size)
    assert result.passed, result
    assert result.num_cases == len(sizing.cases()) >= 20


@pytest.mark.parametrize(
    "wrong, phrase",
    [
        (lambda c: _size(c, slo_key="mean_step_ms"), "from the mean step"),
        (lambda c: _size(c, flat=True), "the step grows with the batch"),
        (lambda c: _size(c, rounding=math.floor), "Round up"),
        (lambda c: _size(c, prefill=False), "prompt also takes"),
        (lambda c: _size(c, step_key="p99_step_ms"), "overprovisions"),
    ],
)
def test_each_usual_mistake_is_named(wrong, phrase):
    result = sizing.check(wrong)
    assert not result.passed and phrase in result.message, result


def test_unnamed_wrong_answers_and_bad_shapes():
    result = sizing.check(lambda c: (_size(c)[0], 1000))
    assert not result.passed and "not in a way the usual mistakes give" in result.message
    assert "return a pair" in sizing.check(lambda c: 3).message
    assert "whole numbers" in sizing.check(lambda c: (16, 2.5)).message
    assert "not implemented" in sizing.check(lambda c: (_ for _ in ()).throw(NotImplementedError)).message
    assert "raised ZeroDivisionError" in sizing.check(lambda c: 1 / 0).message


def test_hint_points_to_the_idea_without_the_numbers():
    hint = sizing.hint()
    assert "P99" not in hint and "ceil" not in hint and "mean" not in hint


def test_case_from_timings_reads_every_step():
    timings = [DecodeTiming(1, 0.01, 0.01, steps_s=(0.01, 0.01, 0.02)), DecodeTiming(4, 0.02, 0.02, steps_s=(0.02,) * 4)]
    case = sizing.case_from_timings(timings, requests_per_s=2.0, prompt_tokens=100, output_tokens=50,
                                    p99_tpot_ms=30, prefill_ms_per_token=0.1)
    assert [r.batch for r in case.steps] == [1, 4]
    assert case.steps[0].mean_step_ms == pytest.approx(40 / 3)
    assert case.steps[0].p99_step_ms == pytest.approx(19.8)
    assert case.steps[1].p99_step_ms == pytest.approx(20.0)
    assert "P99 ITL (each gap between tokens) <= 30" in str(case)
