"""The rate limiter on its own: token buckets per key, with a clock moved by hand (no sleeps).

Hypothesis drives random admissions, settlements, refunds and clock moves against invariants
that any correct limiter keeps: levels within [0, limit]; over any interval no more is admitted
than a full bucket plus what refills plus what was given back; a refused request changes
nothing; Retry-After is exactly when the refused request would pass; a refund at once restores
the state; and the keys file gives errors that name the line or the field.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilm_engine.entrypoints.rate_limit import (
    RateLimiter,
    RateLimitExceeded,
    RateLimits,
    UnknownKey,
    format_duration,
    load_keys_file,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_request_takes_its_tokens_and_one_request_and_settling_gives_back_the_rest():
    clock = Clock()
    limiter = RateLimiter(RateLimits(requests_per_minute=3, tokens_per_minute=600), clock=clock)
    r = limiter.admit("k", 250)
    assert (r.status.tokens.remaining, r.status.requests.remaining) == (350, 2)
    assert r.status.tokens.reset_s == pytest.approx(25.0)  # 250 tokens at 10 tokens/s
    limiter.settle(r, 100)  # the request stopped early: 150 tokens come back
    assert limiter.status("k").tokens.remaining == 500
    limiter.settle(r, 0)  # settled once only
    assert limiter.status("k").tokens.remaining == 500


def test_over_the_token_limit_is_refused_with_the_wait_until_it_would_pass():
    clock = Clock()
    limiter = RateLimiter(RateLimits(tokens_per_minute=600), clock=clock)
    limiter.admit("k", 500)
    with pytest.raises(RateLimitExceeded) as refused:
        limiter.admit("k", 200)  # 100 there, 200 asked: 10 s at 10 tokens/s
    e = refused.value
    assert e.kind == "tokens" and e.retry_after_s == pytest.approx(10.0)
    assert "Limit 600, Used 500, Requested 200" in e.message and "try again in 10s" in e.message
    headers = e.headers()
    assert headers["retry-after"] == "10" and headers["x-ratelimit-remaining-tokens"] == "100"
    assert headers["x-ratelimit-limit-tokens"] == "600" and headers["x-ratelimit-reset-tokens"] == "50s"
    assert "x-ratelimit-limit-requests" not in headers  # no request limit configured
    clock.now += 9.9
    with pytest.raises(RateLimitExceeded):
        limiter.admit("k", 200)
    clock.now += 0.1
    limiter.admit("k", 200)


def test_the_request_limit_binds_independently_of_tokens_and_keys_are_separate():
    clock = Clock()
    limiter = RateLimiter(RateLimits(requests_per_minute=2, tokens_per_minute=10_000), clock=clock)
    limiter.admit("a", 1)
    limiter.admit("a", 1)
    with pytest.raises(RateLimitExceeded) as refused:
        limiter.admit("a", 1)
    assert refused.value.kind == "requests" and refused.value.retry_after_s == pytest.approx(30.0)
    assert "requests per min (RPM): Limit 2, Used 2, Requested 1" in refused.value.message
    limiter.admit("b", 9_999)  # another key has its own buckets


def test_a_request_larger_than_the_limit_can_never_pass_and_says_so():
    limiter = RateLimiter(RateLimits(tokens_per_minute=100), clock=Clock())
    with pytest.raises(RateLimitExceeded) as refused:
        limiter.admit("k", 101)
    assert refused.value.retry_after_s is None and "retry-after" not in refused.value.headers()
    assert "Request too large" in refused.value.message and "Requested 101" in refused.value.message


def test_with_a_keys_file_only_its_keys_exist():
    limiter = RateLimiter(keys={"a": RateLimits(tokens_per_minute=10)}, clock=Clock())
    assert limiter.knows("a") and not limiter.knows("b")
    with pytest.raises(UnknownKey):
        limiter.admit("b", 1)


def test_durations_are_written_as_openai_writes_them():
    assert [format_duration(s) for s in (0.25, 1.0, 1.5, 60.0, 360.0, 3723.0)] == [
        "250ms", "1s", "1.5s", "1m0s", "6m0s", "1h2m3s"]


# -- invariants under random use ---------------------------------------------------------------

operation = st.one_of(
    st.tuples(st.just("admit"), st.sampled_from("ab"), st.integers(0, 700)),
    st.tuples(st.just("wait"), st.floats(0, 90)),
    st.tuples(st.just("settle"), st.integers(0, 50), st.integers(0, 800)),
    st.tuples(st.just("refund"), st.integers(0, 50)),
)


@settings(max_examples=200, deadline=None)
@given(tpm=st.integers(1, 600), rpm=st.integers(1, 20), ops=st.lists(operation, max_size=60))
def test_invariants_under_random_admissions_settlements_and_waits(tpm, rpm, ops):
    clock = Clock()
    limiter = RateLimiter(RateLimits(requests_per_minute=rpm, tokens_per_minute=tpm), clock=clock)
    open_reservations = []
    events = []  # (time, key, tokens taken: + admitted, - given back)
    for op in ops:
        if op[0] == "wait":
            clock.now += op[1]
        elif op[0] == "admit":
            _, key, cost = op
            before = limiter.status(key)
            try:
                reservation = limiter.admit(key, cost)
            except RateLimitExceeded as e:
                assert limiter.status(key) == before  # a refusal takes nothing
                if e.retry_after_s is None:
                    assert cost > tpm
                else:
                    assert e.retry_after_s > 0
                continue
            # took only what was there (the clock stood still since `before`)
            assert cost <= before.tokens.remaining and before.requests.remaining >= 1
            open_reservations.append(reservation)
            events.append((clock.now, key, cost))
        elif open_reservations:
            reservation = open_reservations.pop(op[1] % len(open_reservations))
            before = limiter.status(reservation.key).tokens.remaining
            if op[0] == "settle":
                limiter.settle(reservation, op[2])
                back = reservation.num_tokens - min(op[2], reservation.num_tokens)
            else:
                limiter.refund(reservation)
                back = reservation.num_tokens
            after = limiter.status(reservation.key).tokens.remaining
            assert before <= after <= min(tpm, before + back + 1)
            events.append((clock.now, reservation.key, -back))
        for key in "ab":
            status = limiter.status(key)
            assert 0 <= status.tokens.remaining <= tpm and 0 <= status.requests.remaining <= rpm
            assert status.tokens.reset_s >= 0 and status.requests.reset_s >= 0
    # Over any interval, net tokens taken <= a full bucket + what refilled in between.
    for key in "ab":
        mine = [(t, n) for t, k, n in events if k == key]
        for i in range(len(mine)):
            total = 0
            for j in range(i, len(mine)):
                total += mine[j][1]
                assert total <= tpm + (mine[j][0] - mine[i][0]) * tpm / 60 + 1e-6


@settings(max_examples=200, deadline=None)
@given(tpm=st.integers(1, 1000), first=st.integers(0, 1000), second=st.integers(1, 1000),
       elapsed=st.floats(0, 120))
def test_retry_after_is_exactly_when_the_refused_request_passes(tpm, first, second, elapsed):
    clock = Clock()
    limiter = RateLimiter(RateLimits(tokens_per_minute=tpm), clock=clock)
    if first <= tpm:
        limiter.admit("k", first)
    clock.now += elapsed
    try:
        limiter.admit("k", second)
        return
    except RateLimitExceeded as e:
        refused = e
    wait = refused.retry_after_s
    if second > tpm:
        assert wait is None
        return
    header = int(refused.headers()["retry-after"])
    assert header == max(1, math.ceil(wait))  # whole seconds, never early
    if wait > 1e-3:
        clock.now += wait * 0.999
        with pytest.raises(RateLimitExceeded):
            limiter.admit("k", second)
        clock.now += wait * 0.001 + 1e-6
    else:
        clock.now += wait + 1e-6
    limiter.admit("k", second)


@settings(max_examples=100, deadline=None)
@given(tpm=st.integers(1, 1000), cost=st.integers(0, 1000), used=st.integers(0, 2000))
def test_a_refund_restores_the_state_and_a_settlement_charges_at_most_the_reservation(tpm, cost, used):
    clock = Clock()
    limiter = RateLimiter(RateLimits(requests_per_minute=5, tokens_per_minute=tpm), clock=clock)
    before = limiter.status("k")
    if cost > tpm:
        return
    limiter.refund(limiter.admit("k", cost))
    assert limiter.status("k") == before
    limiter.settle(limiter.admit("k", cost), used)
    assert limiter.status("k").tokens.remaining == tpm - min(cost, used)


# -- the keys file -----------------------------------------------------------------------------


def test_keys_file_fields_default_to_the_flags_and_null_is_unlimited(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"sk-a": {"tokens_per_minute": 500}, "sk-b": {"requests_per_minute": None}}))
    keys = load_keys_file(path, RateLimits(requests_per_minute=60, tokens_per_minute=10_000))
    assert keys == {"sk-a": RateLimits(60, 500), "sk-b": RateLimits(None, 10_000)}


@pytest.mark.parametrize("text, words", [
    ('{\n  "sk-a": {"tokens_per_minute": 5},\n  "sk-b": {"tokens_per_minute": 5,}\n}', ["line 3", "column"]),
    ('{"sk-a": {"tokens_per_minute": -5}}', ["'sk-a'", "tokens_per_minute", "-5"]),
    ('{"sk-a": {"tokens_per_min": 5}}', ["'sk-a'", "unknown field 'tokens_per_min'"]),
    ('{"sk-a": 5}', ["'sk-a'", "expected an object"]),
    ('["sk-a"]', ["non-empty JSON object"]),
    ('{"sk-a": {"requests_per_minute": 1.5}}', ["requests_per_minute", "1.5"]),
])
def test_a_keys_file_that_does_not_parse_names_the_line_or_the_field(tmp_path, text, words):
    path = tmp_path / "keys.json"
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        load_keys_file(path)
    for word in [str(path), *words]:
        assert word in str(error.value)
