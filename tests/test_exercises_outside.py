"""Chapter 10's build exercise: the learner's bucket arithmetic inside the real RateLimiter."""

from __future__ import annotations

import math

import pytest

from minilm_engine.entrypoints.rate_limit import TokenBucket
from minilm_engine.course.teaching.exercises_outside import bucket_exercise, recorded_traffic


def correct(level, capacity, rate, elapsed, amount):
    level = min(capacity, level + elapsed * rate)
    if amount > capacity:
        return False, level, math.inf
    if amount <= level:
        return True, level - amount, 0.0
    return False, level, (amount - level) / rate


def overfills(level, capacity, rate, elapsed, amount):
    level = level + elapsed * rate  # no cap
    if amount > capacity:
        return False, level, math.inf
    if amount <= level:
        return True, level - amount, 0.0
    return False, level, (amount - level) / rate


def never_refills(level, capacity, rate, elapsed, amount):
    if amount <= level:
        return True, level - amount, 0.0
    return False, level, math.inf if amount > capacity else (amount - level) / rate


def goes_negative(level, capacity, rate, elapsed, amount):
    level = min(capacity, level + elapsed * rate)
    if level > 0:  # admits whenever something is left: the bucket goes into debt
        return True, level - amount, 0.0
    return False, level, (amount - level) / rate


def waits_for_the_whole_request(level, capacity, rate, elapsed, amount):
    level = min(capacity, level + elapsed * rate)
    if amount > capacity:
        return False, level, math.inf
    if amount <= level:
        return True, level - amount, 0.0
    return False, level, amount / rate


def finite_wait_for_too_large(level, capacity, rate, elapsed, amount):
    level = min(capacity, level + elapsed * rate)
    if amount <= level:
        return True, level - amount, 0.0
    return False, level, (amount - level) / rate


def test_a_correct_bucket_passes_in_the_limiter_and_on_a_real_server():
    result = bucket_exercise.check(correct)
    assert result.passed, result.message
    assert "real server" in result.message and result.num_cases > 50


@pytest.mark.parametrize("attempt, words", [
    (overfills, "more than its capacity"),
    (never_refills, "refill with the elapsed time"),
    (goes_negative, "never goes negative"),
    (waits_for_the_whole_request, "*missing* tokens"),
    (finite_wait_for_too_large, "math.inf"),
])
def test_each_usual_mistake_fails_with_its_own_message(attempt, words):
    result = bucket_exercise.check(attempt, serve=False)
    assert not result.passed and words in result.message, result.message


def decides_before_refilling(level, capacity, rate, elapsed, amount):
    if amount > capacity:
        return False, min(capacity, level + elapsed * rate), math.inf
    if level >= amount:
        return True, min(capacity, level + elapsed * rate) - amount, 0.0
    level = min(capacity, level + elapsed * rate)
    return False, level, (amount - level) / rate


def refuses_its_capacity(level, capacity, rate, elapsed, amount):
    level = min(capacity, level + elapsed * rate)
    if amount >= capacity:
        return False, level, math.inf
    if amount <= level:
        return True, level - amount, 0.0
    return False, level, (amount - level) / rate


def forgets_the_refill_when_refusing(level, capacity, rate, elapsed, amount):
    admitted, new_level, wait = correct(level, capacity, rate, elapsed, amount)
    return (admitted, new_level, wait) if admitted else (False, level, wait)


@pytest.mark.parametrize("attempt, words", [
    (decides_before_refilling, "refill first, then decide on the level"),
    (refuses_its_capacity, "a request of exactly the capacity (100) fits a full bucket"),
    (forgets_the_refill_when_refusing, "after a refusal the bucket keeps what it holds"),
])
def test_mistakes_the_recorded_traffic_cannot_reach_are_named(attempt, words):
    # The limiter refills with amount 0 and takes with no time elapsed, and no recorded request
    # asks for exactly a limit: these attempts pass the replay; the edge cases catch them.
    result = bucket_exercise.check(attempt, serve=False)
    assert not result.passed and words in result.message, result.message


def test_bad_answers_are_reported_not_raised():
    def raises(*args):
        raise NotImplementedError

    assert "not written yet" in bucket_exercise.check(raises).message
    assert "ZeroDivisionError" in bucket_exercise.check(lambda *a: 1 / 0).message
    assert "tuple" in bucket_exercise.check(lambda *a: [True, 0, 0]).message
    assert "True or False" in bucket_exercise.check(lambda *a: (1, 0.0, 0.0)).message
    assert "function itself" in bucket_exercise.check(3).message


def test_the_package_own_code_gets_a_nudge():
    bucket = TokenBucket(10, 0.0)
    result = bucket_exercise.check(bucket.seconds_until)
    assert not result.passed and "yourself" in result.message


def test_the_recorded_traffic_exercises_every_case():
    events = recorded_traffic()
    assert {e.action for e in events} == {"admit", "settle", "refund"}
    assert any(e.tokens > 2000 for e in events)  # above a whole limit
    times = [e.time_s for e in events]
    assert times == sorted(times) and max(b - a for a, b in zip(times, times[1:])) >= 60
