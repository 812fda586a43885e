"""Chapter 04's judgment exercise: the checker passes the right rule, names each usual mistake, and
judges a pick on the learner's own sweep; `budget_sweep` measures the rows it judges."""

from __future__ import annotations

import pytest

from minilm_engine.course.teaching import judgment_tradeoff as jt

MISTAKE_OF = {"mean": jt.MEAN_ITL, "ignored_ttft": jt.IGNORED_TTFT, "largest_meeting": jt.IGNORED_TTFT,
              "below": jt.BELOW_DECODE_BATCH, "missed": jt.MISSED_TARGET}


def right_rule(sweep, p99_itl_target_s, num_decoding):
    ok = [r for r in sweep if r["max_num_batched_tokens"] > num_decoding and r["p99_itl_s"] <= p99_itl_target_s]
    return min(ok, key=lambda r: r["long_ttft_s"])["max_num_batched_tokens"] if ok else None


def by_mean(sweep, p99_itl_target_s, num_decoding):
    ok = [r for r in sweep if r["max_num_batched_tokens"] > num_decoding and r["mean_itl_s"] <= p99_itl_target_s]
    return min(ok, key=lambda r: r["long_ttft_s"])["max_num_batched_tokens"] if ok else None


def safest_meeting(sweep, p99_itl_target_s, num_decoding):
    ok = [r["max_num_batched_tokens"] for r in sweep
          if r["max_num_batched_tokens"] > num_decoding and r["p99_itl_s"] <= p99_itl_target_s]
    return min(ok) if ok else None


def smallest_budget(sweep, p99_itl_target_s, num_decoding):
    return min(r["max_num_batched_tokens"] for r in sweep)


def no_chunking(sweep, p99_itl_target_s, num_decoding):
    return max(r["max_num_batched_tokens"] for r in sweep)


def test_the_right_rule_passes() -> None:
    result = jt.check(right_rule)
    assert result.passed, result.message
    assert result.num_cases == len(jt.cases()) >= 6


@pytest.mark.parametrize(("rule", "mistake"), [
    (by_mean, jt.MEAN_ITL),
    (safest_meeting, jt.IGNORED_TTFT),
    (smallest_budget, jt.BELOW_DECODE_BATCH),
    (no_chunking, jt.MEAN_ITL),  # the unchunked budget's mean ITL hides its one long stall
    (lambda sweep, target, n: None, jt.SAID_NONE),
    (lambda sweep, target, n: 100, jt.NOT_SWEPT),
    (lambda sweep, target, n: "64", jt.WRONG_TYPE),
])
def test_each_wrong_rule_gets_its_own_message(rule, mistake) -> None:
    result = jt.check(rule)
    assert not result.passed
    assert mistake in result.message, result.message
    others = {jt.NOT_PICKED, jt.MEAN_ITL, jt.IGNORED_TTFT, jt.BELOW_DECODE_BATCH, jt.MISSED_TARGET, jt.NOT_SWEPT,
              jt.SAID_NONE, jt.WRONG_TYPE} - {mistake}
    assert not any(f"{o}:" in result.message for o in others), result.message


def test_unwritten_crashing_and_non_callable_attempts_get_feedback() -> None:
    def unwritten(sweep, target, n):
        raise NotImplementedError

    assert "not implemented yet" in jt.check(unwritten).message
    crashed = jt.check(lambda sweep, target, n: sweep[99])
    assert not crashed.passed and "IndexError" in crashed.message and "case 1" in crashed.message
    assert "pass your function itself" in jt.check(64).message


def test_stored_cases_agree_with_the_judge() -> None:
    for case in jt.cases():
        inputs = case["inputs"]
        args = (inputs["sweep"], inputs["p99_itl_target_s"], inputs["num_decoding"])
        assert jt.judge_pick(case["expected"], *args)[0] is None, case["story"]
        assert right_rule(*args) == case["expected"], case["story"]
        assert case["mistakes"], case["story"]
        for kind, pick in case["mistakes"].items():
            assert pick != case["expected"]
            assert jt.judge_pick(pick, *args)[0] == MISTAKE_OF[kind], (case["story"], kind, pick)


def test_check_pick_judges_the_learners_own_sweep() -> None:
    case = jt.cases()[0]["inputs"]
    sweep, target, n = case["sweep"], case["p99_itl_target_s"], case["num_decoding"]
    assert jt.check_pick(64, sweep, target, n).passed
    assert not jt.check_pick(64, sweep, 0.03, n).passed  # the learner's own target changes the answer
    wrong = jt.check_pick(4, sweep, target, n)
    assert not wrong.passed and jt.BELOW_DECODE_BATCH in wrong.message
    assert jt.IGNORED_TTFT in jt.check_pick(16, sweep, target, n).message
    assert "right: no budget" in jt.check_pick(None, sweep, 0.001, n).message
    assert jt.check_pick(None, sweep, 0.001, n).passed
    assert jt.NOT_PICKED in jt.check_pick(..., sweep, 0.001, n).message  # the notebook's placeholder never passes


def test_budget_sweep_measures_the_rows_the_checker_reads() -> None:
    from minilm_engine import LLM
    from minilm_engine.course.noodle_corpus import sample_prompts
    from minilm_engine.course.experiments import prefill

    ids = prefill.corpus_token_ids(LLM("noodle-chef").tokenizer, 120, seed=7)
    rows = prefill.budget_sweep("noodle-chef", [8, 256], sample_prompts(2, seed=1), ids,
                                num_stream_tokens=12, inject_after_steps=3)
    assert [r["max_num_batched_tokens"] for r in rows] == [8, 256]
    for r in rows:
        assert 0 < r["mean_itl_s"] <= r["p99_itl_s"] and r["long_ttft_s"] > 0
    # A budget of 8 with 2 streams decoding prefills the 120-token prompt 6 tokens a step: it
    # waits longer for its first token than with room for the whole prompt in one step.
    assert rows[0]["long_ttft_s"] > rows[1]["long_ttft_s"]
    assert jt.judge_pick(8, rows, 10.0, 2)[0] in (None, jt.IGNORED_TTFT)
    with pytest.raises(ValueError, match="positive"):
        prefill.budget_sweep("noodle-chef", [0], sample_prompts(1), ids, 4, 1)
