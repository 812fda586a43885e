"""The client that copes (bench/client.py): backoff with full jitter that honours Retry-After,
retries only what is worth retrying, timed from the first try; and against a real rate-limited
server, a spike that a naive client partly loses and this one completes."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minilm_engine.bench.cli import add_bench_parser, config_from_args
from minilm_engine.bench.client import RetryPolicy, backoff_delay, retry_after_of, with_retries
from minilm_engine.bench.metrics import RequestResult
from minilm_engine import LLM
from minilm_engine.bench.datasets import noodle_requests
from minilm_engine.bench.serve import BenchConfig, run_benchmark
from minilm_engine.course.experiments.server_thread import ServerThread
from minilm_engine.entrypoints.rate_limit import RateLimiter, RateLimits
from minilm_engine.course.experiments.client_view import client_view, spike_table


@given(attempt=st.integers(0, 20), retry_after=st.one_of(st.none(), st.floats(0, 100)),
       base=st.floats(0.01, 2), cap=st.floats(2, 60), seed=st.integers(0, 2**32))
def test_the_wait_is_retry_after_plus_full_jitter_under_the_exponential_cap(attempt, retry_after, base, cap, seed):
    policy = RetryPolicy(max_retries=5, base_delay_s=base, max_delay_s=cap)
    delay = backoff_delay(policy, attempt, retry_after, random.Random(seed))
    floor = retry_after or 0.0
    assert floor <= delay <= floor + min(cap, base * 2**attempt)


def test_full_jitter_spreads_the_waits_over_the_whole_interval():
    policy = RetryPolicy(max_retries=5, base_delay_s=1.0, max_delay_s=30.0)
    rng = random.Random(0)
    delays = [backoff_delay(policy, 3, None, rng) for _ in range(2000)]  # uniform on [0, 8]
    assert min(delays) < 0.2 and max(delays) > 7.8
    assert sum(delays) / len(delays) == pytest.approx(4.0, abs=0.25)
    assert sum(d < 4 for d in delays) == pytest.approx(1000, abs=100)  # half below the middle


def answers(*statuses):
    """An attempt() that answers these statuses in turn (200: success), counting its calls."""
    calls = []

    async def attempt():
        status = statuses[len(calls)]
        calls.append(status)
        result = RequestResult(sent_time=float(len(calls)), http_status=status, success=status == 200)
        result.retry_after_s = 2.0 if status == 429 else None
        return result

    return attempt, calls


def run(attempt, policy):
    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    result = asyncio.run(with_retries(attempt, policy, random.Random(0), sleep))
    return result, slept


def test_retries_429_and_503_and_no_answer_then_succeeds_timed_from_the_first_try():
    attempt, calls = answers(429, 503, None, 200)
    result, slept = run(attempt, RetryPolicy(max_retries=5, base_delay_s=0.1))
    assert result.success and calls == [429, 503, None, 200]
    assert result.num_retries == 3 and result.sent_time == 1.0  # the first try's
    assert slept[0] >= 2.0  # Retry-After honoured
    assert result.retry_wait_s == pytest.approx(sum(slept))


def test_does_not_retry_a_client_error_and_stops_after_max_retries():
    attempt, calls = answers(400, 200)
    result, slept = run(attempt, RetryPolicy(max_retries=5))
    assert not result.success and calls == [400] and slept == []
    attempt, calls = answers(429, 429, 429, 200)
    result, slept = run(attempt, RetryPolicy(max_retries=2))
    assert not result.success and calls == [429, 429, 429] and result.num_retries == 2
    attempt, calls = answers(429, 200)
    result, _ = run(attempt, RetryPolicy(max_retries=0))  # the naive client
    assert calls == [429] and result.http_status == 429


def test_retry_after_is_read_in_milliseconds_first_then_seconds():
    assert retry_after_of({"retry-after": "3", "retry-after-ms": "2500"}) == 2.5
    assert retry_after_of({"retry-after": "3"}) == 3.0
    assert retry_after_of({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert retry_after_of({}) is None


def test_bench_serve_takes_the_retry_flags():
    import argparse

    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", "serve", "--model", "m", "--max-retries", "4", "--retry-base-delay", "0.25",
                              "--timeout", "12"])
    config = config_from_args(args)
    assert (config.max_retries, config.retry_base_delay_s, config.timeout_s) == (4, 0.25, 12.0)
    with pytest.raises(ValueError, match="max_retries"):
        config_from_args(parser.parse_args(["bench", "serve", "--model", "m", "--max-retries", "-1"]))


def check_spike(table, num_requests: int) -> None:
    naive, copes = table.iloc[0], table.iloc[1]
    assert naive["failed"] > 0 and naive["completed"] + naive["failed"] == num_requests
    assert naive["429s seen"] == naive["failed"] and naive["retries"] == 0
    assert copes["completed"] == num_requests and copes["failed"] == 0
    assert copes["retries"] >= naive["failed"] and copes["429s seen"] == copes["retries"]
    assert copes["mean wait s"] > 0 and copes["E2E p99 ms"] > naive["E2E p50 ms"]  # waiting costs latency


def test_bench_serve_waits_out_a_used_up_key_before_it_starts_and_retries_in_the_run():
    limiter = RateLimiter(RateLimits(requests_per_minute=2), period_s=1.0)  # 2 requests a second
    with ServerThread(LLM("noodle-apprentice", device="cpu", record_trace=False), rate_limiter=limiter) as server:
        limiter.admit("", 0), limiter.admit("", 0)  # the (anonymous) key is used up now
        config = BenchConfig(base_url=server.url, model="noodle-apprentice", initial_test=True, ready_timeout_s=10,
                             max_retries=10, retry_base_delay_s=0.05)
        result = run_benchmark(config, noodle_requests(4, 4), progress=False)
    assert result.metrics.num_completed == 4 and sum(r.num_retries for r in result.results) >= 1


def test_under_a_token_limit_a_spike_is_partly_lost_by_a_naive_client_and_completed_by_one_that_copes():
    limiter = RateLimiter(RateLimits(tokens_per_minute=120), period_s=1.0)  # 120 tokens a second
    with ServerThread(LLM("noodle-apprentice", device="cpu", record_trace=False), rate_limiter=limiter) as server:
        table = spike_table(server.url, "noodle-apprentice", noodle_requests(12, 8), max_retries=20)
    check_spike(table, 12)


@pytest.mark.slow
def test_client_view_measures_the_same_from_outside_the_server_process():
    check_spike(client_view(num_requests=12, max_tokens=8, tokens_per_period=120, period_s=1.0, max_retries=20), 12)
