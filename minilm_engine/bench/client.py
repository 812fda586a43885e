"""A client that copes with a busy server: retries with exponential backoff and full jitter.

Contract: `RetryPolicy` says which answers are worth another try (429, 503, no answer at all)
and how long to wait; `with_retries(attempt, policy, rng)` calls `attempt()` until it succeeds,
gets an answer not worth retrying, or runs out of retries, and returns the last result timed
from the first try (its TTFT and E2E include the waiting, as the user lives it).

    wait before retry n (n = 0, 1, ...) = Retry-After (if the server sent one)
                                         + uniform(0, min(max_delay, base_delay x 2^n))

Full jitter spreads clients refused together over the whole interval, so they do not come back
together; Retry-After first, because the server knows when the request would pass.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from minilm_engine.bench.metrics import RequestResult

RETRY_STATUSES = (429, 503)


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 0  # 0: a naive client, one try
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0  # the exponential cap of the jitter (Retry-After is added whole)

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {self.max_retries!r}")
        if not 0 <= self.base_delay_s <= self.max_delay_s:
            raise ValueError(f"need 0 <= base_delay_s <= max_delay_s, got {self.base_delay_s}, {self.max_delay_s}")

    def should_retry(self, result: RequestResult) -> bool:
        # No answer at all (connection refused, reset, timed out) is worth another try too.
        status = result.http_status
        return not result.success and (status is None or status in RETRY_STATUSES)


def backoff_delay(policy: RetryPolicy, attempt: int, retry_after_s: float | None, rng: random.Random) -> float:
    """Seconds to wait before retry number `attempt` (0 for the first retry)."""
    cap = min(policy.max_delay_s, policy.base_delay_s * 2**attempt)
    return (retry_after_s or 0.0) + rng.uniform(0.0, cap)


async def with_retries(attempt: Callable[[], Awaitable[RequestResult]], policy: RetryPolicy,
                       rng: random.Random, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> RequestResult:
    """`attempt()` until it succeeds or `policy` says stop; the last result, timed from the first
    try, with `num_retries` and `retry_wait_s` (seconds spent waiting between tries) filled in."""
    first_sent = None
    waited = 0.0
    num_retries = 0
    while True:
        result = await attempt()
        if first_sent is None:
            first_sent = result.sent_time
        if num_retries >= policy.max_retries or not policy.should_retry(result):
            break
        delay = backoff_delay(policy, num_retries, result.retry_after_s, rng)
        await sleep(delay)
        waited += delay
        num_retries += 1
    result.sent_time = first_sent
    result.num_retries, result.retry_wait_s = num_retries, waited
    return result


def retry_after_of(headers) -> float | None:
    """The server's wait in seconds: `retry-after-ms` if sent (finer), else `Retry-After` in its
    delay-seconds form (an HTTP date, or garbage, is None: back off without it)."""
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None
