"""Per-key rate limits in requests and tokens per minute, as hosted APIs count them.

Contract: `RateLimiter.admit(key, num_tokens)` takes one request and `num_tokens` (prompt +
max_tokens: the most the request can cost) from the key's buckets and returns a `Reservation`,
or raises `RateLimitExceeded` having taken nothing; `settle(reservation, num_used)` gives back
what was reserved but not used, `refund` everything.  With `keys`, an unknown key is
`UnknownKey`.  `status(key)` is what the `x-ratelimit-*` headers report.  Time comes from `clock`.

Each limit is a token bucket of `limit` units (the largest burst) refilling at `limit / 60`
units a second.  Reserving max_tokens keeps a burst of long requests from passing at once;
settling keeps a request that stopped early from being charged for tokens it never produced.

    level ▲ limit ─────────╮         ╭────────── refills at limit/60 per s
          │                ╰─────────╯ <- admit takes prompt + max_tokens; settle gives back
          └────────────────────────────────────────────────────▶ time
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SECONDS_PER_MINUTE = 60.0
LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute")


@dataclass(frozen=True)
class RateLimits:
    """A key's limits; None: unlimited in that dimension."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    def __post_init__(self) -> None:
        for name in LIMIT_FIELDS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int or null (unlimited), got {value!r}")

    @property
    def is_unlimited(self) -> bool:
        return self.requests_per_minute is None and self.tokens_per_minute is None


class TokenBucket:
    """Invariant: 0 <= level <= capacity at every clock time (refill never overfills, admission
    never takes more than is there, a refund is capped at the capacity)."""

    def __init__(self, capacity: int, now: float, period_s: float = SECONDS_PER_MINUTE):
        self.capacity = capacity
        self.rate = capacity / period_s  # units per second
        self.level = float(capacity)  # a new key starts with a full minute's budget
        self.updated = now

    def refill(self, now: float) -> None:
        if now > self.updated:  # a clock that stands still (or steps back) adds nothing
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def seconds_until(self, amount: float) -> float:
        """How long until `amount` units are there (0: now; inf: never, it exceeds the capacity)."""
        if amount > self.capacity:
            return math.inf
        return max(0.0, (amount - self.level) / self.rate)

    def take(self, amount: float) -> None:
        self.level -= amount

    def give_back(self, amount: float) -> None:
        self.level = min(self.capacity, self.level + amount)

    def seconds_to_full(self) -> float:
        return (self.capacity - self.level) / self.rate


@dataclass(frozen=True)
class LimitStatus:
    """One dimension (requests or tokens) of a key now."""

    limit: int
    remaining: int  # whole units there now
    reset_s: float  # until the bucket is full again (OpenAI's "resets to its initial state")


@dataclass(frozen=True)
class KeyStatus:
    requests: LimitStatus | None  # None: unlimited
    tokens: LimitStatus | None

    def headers(self) -> dict[str, str]:
        """OpenAI's names: x-ratelimit-{limit,remaining,reset}-{requests,tokens}."""
        out = {}
        for kind, status in (("requests", self.requests), ("tokens", self.tokens)):
            if status is not None:
                out[f"x-ratelimit-limit-{kind}"] = str(status.limit)
                out[f"x-ratelimit-remaining-{kind}"] = str(status.remaining)
                out[f"x-ratelimit-reset-{kind}"] = format_duration(status.reset_s)
        return out


@dataclass
class Reservation:
    """What `admit` took for one HTTP request; settled or refunded once."""

    key: str
    num_tokens: int
    status: KeyStatus  # right after admission (the headers of the answer)
    closed: bool = False


class RateLimitExceeded(Exception):
    """`kind` ("requests" or "tokens") is the limit that binds, `retry_after_s` the wait until
    this request would pass (None: never, it is larger than the limit itself)."""

    def __init__(self, message: str, kind: str, retry_after_s: float | None, status: KeyStatus):
        super().__init__(message)
        self.message, self.kind, self.retry_after_s, self.status = message, kind, retry_after_s, status

    def headers(self) -> dict[str, str]:
        out = self.status.headers()
        if self.retry_after_s is not None:
            # Retry-After is whole seconds (RFC 9110); some hosted APIs add milliseconds.
            out["retry-after"] = str(max(1, math.ceil(self.retry_after_s)))
            out["retry-after-ms"] = str(max(1, math.ceil(self.retry_after_s * 1000)))
        return out


class UnknownKey(Exception):
    pass


@dataclass
class RateLimiter:
    """Buckets per API key.  `keys`: limits per key (a keys file); None: every key (and no key,
    "") gets `default_limits`.  `period_s`: the time a limit counts over (a demo shortens it)."""

    default_limits: RateLimits = field(default_factory=RateLimits)
    keys: dict[str, RateLimits] | None = None
    clock: Callable[[], float] = time.monotonic
    period_s: float = SECONDS_PER_MINUTE
    # `TokenBucket`, or one with its methods (chapter 10's exercise plugs a learner's in here).
    bucket_type: Callable[[int, float, float], TokenBucket] = TokenBucket

    def __post_init__(self) -> None:
        if not self.period_s > 0:
            raise ValueError(f"period_s must be > 0, got {self.period_s}")
        self._states: dict[str, dict[str, TokenBucket]] = {}
        self._lock = threading.Lock()

    @property
    def is_enabled(self) -> bool:
        limits = [self.default_limits] if self.keys is None else list(self.keys.values())
        return any(not lim.is_unlimited for lim in limits)

    def knows(self, key: str) -> bool:
        return self.keys is None or key in self.keys

    def limits_for(self, key: str) -> RateLimits:
        if self.keys is None:
            return self.default_limits
        if key not in self.keys:
            raise UnknownKey(key)
        return self.keys[key]

    def _buckets(self, key: str, now: float) -> dict[str, TokenBucket]:
        """The key's limited kinds ("requests", "tokens") and their buckets, refilled to `now`."""
        buckets = self._states.get(key)
        if buckets is None:
            limits = self.limits_for(key)
            per_kind = {"requests": limits.requests_per_minute, "tokens": limits.tokens_per_minute}
            buckets = {kind: self.bucket_type(limit, now, self.period_s)
                       for kind, limit in per_kind.items() if limit is not None}
            self._states[key] = buckets
        for bucket in buckets.values():
            bucket.refill(now)
        return buckets

    def admit(self, key: str, num_tokens: int) -> Reservation:
        """Take 1 request and `num_tokens` tokens from `key`'s buckets, or raise
        `RateLimitExceeded` (nothing taken) / `UnknownKey`."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        with self._lock:
            buckets = self._buckets(key, self.clock())
            amounts = {"requests": 1, "tokens": num_tokens}
            waits = {kind: bucket.seconds_until(amounts[kind]) for kind, bucket in buckets.items()}
            if any(wait > 0 for wait in waits.values()):
                binds_tokens = waits.get("tokens", 0.0) >= waits.get("requests", 0.0)
                kind = "tokens" if binds_tokens else "requests"
                raise self._exceeded(buckets, kind, amounts[kind], waits[kind])
            for kind, bucket in buckets.items():
                bucket.take(amounts[kind])
            return Reservation(key, num_tokens, _status(buckets))

    def settle(self, reservation: Reservation, num_used: int) -> None:
        """The request used `num_used` tokens (prompt + output): the rest goes back (a count above
        the reservation is charged as the reservation)."""
        self._give_back(reservation, reservation.num_tokens - min(max(num_used, 0), reservation.num_tokens), 0)

    def refund(self, reservation: Reservation) -> None:
        """The request did no work (the engine refused it, the server failed): all back."""
        self._give_back(reservation, reservation.num_tokens, 1)

    def _give_back(self, reservation: Reservation, num_tokens: int, num_requests: int) -> None:
        with self._lock:
            if reservation.closed:
                return
            reservation.closed = True
            amounts = {"requests": num_requests, "tokens": num_tokens}
            for kind, bucket in self._buckets(reservation.key, self.clock()).items():
                bucket.give_back(amounts[kind])

    def status(self, key: str) -> KeyStatus:
        with self._lock:
            return _status(self._buckets(key, self.clock()))

    @staticmethod
    def _exceeded(buckets: dict[str, TokenBucket], kind: str, requested: int,
                  wait_s: float) -> RateLimitExceeded:
        bucket = buckets[kind]
        unit = "tokens per min (TPM)" if kind == "tokens" else "requests per min (RPM)"
        if math.isinf(wait_s):
            message = (f"Request too large on {unit}: Limit {bucket.capacity}, Requested {requested}. "
                       f"The prompt or max_tokens must be reduced for the request to ever pass.")
            return RateLimitExceeded(message, kind, None, _status(buckets))
        used = bucket.capacity - math.floor(bucket.level)
        message = (f"Rate limit reached on {unit}: Limit {bucket.capacity}, Used {used}, Requested "
                   f"{requested}. Please try again in {format_duration(wait_s)}.")
        return RateLimitExceeded(message, kind, wait_s, _status(buckets))


def _status(buckets: dict[str, TokenBucket]) -> KeyStatus:
    status = {kind: LimitStatus(bucket.capacity, math.floor(bucket.level + 1e-9),
                                bucket.seconds_to_full()) for kind, bucket in buckets.items()}
    return KeyStatus(status.get("requests"), status.get("tokens"))


def format_duration(seconds: float) -> str:
    """As OpenAI writes a reset time: "250ms", "1.5s", "6m0s", "1h2m3s"."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    secs_text = f"{secs:.3f}".rstrip("0").rstrip(".")
    if hours >= 1:
        return f"{int(hours)}h{int(minutes)}m{secs_text}s"
    if minutes >= 1:
        return f"{int(minutes)}m{secs_text}s"
    return f"{secs_text}s"


# -- the keys file -------------------------------------------------------------------------------


def load_keys_file(path: str | Path, default_limits: RateLimits = RateLimits()) -> dict[str, RateLimits]:
    """{"KEY": {"requests_per_minute": 60, "tokens_per_minute": 10000}, ...} -> limits per key; a
    field left out takes the default, null is unlimited.  ValueError names the line or key."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"--api-keys-file {path}: cannot read it: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--api-keys-file {path}: not valid JSON at line {e.lineno}, column {e.colno}: "
                         f"{e.msg}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"--api-keys-file {path}: expected a non-empty JSON object mapping each API key to its "
                         f'limits, e.g. {{"sk-a": {{"tokens_per_minute": 10000, "requests_per_minute": 60}}}}')
    keys = {}
    for key, entry in data.items():
        if not key:
            raise ValueError(f"--api-keys-file {path}: an API key must be a non-empty string")
        if not isinstance(entry, dict):
            raise ValueError(f"--api-keys-file {path}: key {key!r}: expected an object of limits, "
                             f"got {type(entry).__name__}")
        unknown = sorted(set(entry) - set(LIMIT_FIELDS))
        if unknown:
            raise ValueError(f"--api-keys-file {path}: key {key!r}: unknown field {unknown[0]!r}; "
                             f"the fields are {list(LIMIT_FIELDS)}")
        values = {name: entry.get(name, getattr(default_limits, name)) for name in LIMIT_FIELDS}
        try:
            keys[key] = RateLimits(**values)
        except ValueError as e:
            raise ValueError(f"--api-keys-file {path}: key {key!r}: {e}") from None
    return keys
