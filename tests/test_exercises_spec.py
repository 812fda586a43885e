"""Tests for minilm_engine.course.teaching.exercises_spec: the checkers pass the engine's rule and
catch the tempting wrong ones, with a message that says what is wrong."""

from __future__ import annotations

import torch

from minilm_engine.course.teaching.exercises_spec import (
    acceptance_rule_exercise,
    reference_accept_or_resample,
    tokens_per_round_exercise,
)


def my_rule(p, q, draft_token, generator):
    if torch.rand((), generator=generator).item() < (p[draft_token] / q[draft_token]).item():
        return draft_token
    residual = (p - q).clamp(min=0)
    return int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


def test_a_rule_written_from_the_idea_passes():
    assert acceptance_rule_exercise.check(my_rule).passed


def test_the_engines_rule_gets_a_nudge_passed_or_called():
    from minilm_engine.worker.spec_decode import rejection_sampler

    result = acceptance_rule_exercise.check(reference_accept_or_resample)
    assert not result.passed and "package's own" in result.message and "write it yourself" in result.message

    def calls_it(p, q, draft_token, generator):
        if torch.rand((), generator=generator).item() < (p[draft_token] / q[draft_token]).item():
            return draft_token
        return int(torch.multinomial(rejection_sampler.recovered_distribution(p, q), 1, generator=generator))

    result = acceptance_rule_exercise.check(calls_it)
    assert not result.passed and "your function calls it" in result.message


def test_resampling_from_p_after_a_rejection_fails_the_chi_square():
    def wrong(p, q, draft_token, generator):
        if torch.rand((), generator=generator).item() < min(1.0, (p[draft_token] / q[draft_token]).item()):
            return draft_token
        return int(torch.multinomial(p, 1, generator=generator))

    result = acceptance_rule_exercise.check(wrong)
    assert not result.passed and "not distributed as the target's p" in result.message


def test_ignoring_the_draft_is_caught_as_waste_and_bad_returns_are_explained():
    always_target = acceptance_rule_exercise.check(lambda p, q, d, g: int(torch.multinomial(p, 1, generator=g)))
    assert not always_target.passed and "throwing good drafts away" in always_target.message
    assert "must return a token id" in acceptance_rule_exercise.check(lambda p, q, d, g: "x").message

    def stub(p, q, d, g):
        raise NotImplementedError

    assert "not implemented yet" in acceptance_rule_exercise.check(stub).message


def test_tokens_per_round_checker():
    assert tokens_per_round_exercise.check(lambda alpha, num_speculative_tokens: sum(alpha**i for i in range(num_speculative_tokens + 1))).passed
    naive = tokens_per_round_exercise.check(lambda alpha, num_speculative_tokens: (1 - alpha ** (num_speculative_tokens + 1)) / (1 - alpha))
    assert not naive.passed and "ZeroDivisionError" in naive.message  # alpha = 1 is among the cases
