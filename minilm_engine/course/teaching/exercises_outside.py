"""Chapter 10's build exercise: the rate limiter's token-bucket arithmetic, graded inside the
package's real `RateLimiter` and a real server.

The learner writes

    take_from_bucket(level, capacity, rate_per_s, elapsed_s, amount) -> (admitted, new_level, retry_after_s)

`bucket_exercise.check(fn)` wraps it in `LearnerBucket` (the `TokenBucket` interface, every
decision made by `fn`) and plugs that into `RateLimiter(bucket_type=...)`, the limiter `serve`
uses; then it

1. replays a recorded mix of traffic (several keys, limits in requests and in tokens, bursts,
   long idle gaps, requests larger than a whole limit, settles and refunds) through that limiter
   and through the reference one, event by event, on a hand-moved clock, and names the first
   event where the two disagree (admitted or refused, `Retry-After`, the tokens left), with the
   usual mistake it points to (a bucket that overfills after an idle gap, one that never
   refills, one that goes negative, a wait computed from the whole request);
2. asks it directly the edges the limiter's own calls never reach (`edge_case_mistake`: it
   refills with amount 0 and takes with no time elapsed): a refill and a request in one call
   (refill first, then decide), a request of exactly the capacity, the level after a refusal;
3. if that passes, serves the shipped chef with the learner's limiter and checks that real HTTP
   requests get the reference's 200s and 429s, and that no KV block is left held.

It never raises on a wrong answer: an exception in the learner's code, a wrong return type or
a NaN is reported as such.  Passing the package's own `TokenBucket` methods is answered with a
nudge to write one's own.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from minilm_engine.entrypoints.rate_limit import RateLimiter, RateLimitExceeded, RateLimits, TokenBucket
from minilm_engine.course.teaching.exercises import CheckResult

Take = Callable[[float, int, float, float, float], tuple]


class LearnerAnswerError(Exception):
    """The learner's function raised or answered something that is not (bool, number, number)."""


def _call(fn: Take, level: float, capacity: int, rate: float, elapsed: float, amount: float) -> tuple[bool, float, float]:
    try:
        answer = fn(level, capacity, rate, elapsed, amount)
    except NotImplementedError:
        raise
    except Exception as e:  # the learner's bug, reported in words
        raise LearnerAnswerError(
            f"take_from_bucket({level:g}, {capacity}, {rate:g}, {elapsed:g}, {amount:g}) raised "
            f"{type(e).__name__}: {e}") from None
    if not (isinstance(answer, tuple) and len(answer) == 3):
        raise LearnerAnswerError(f"take_from_bucket must return a tuple (admitted, new_level, retry_after_s), "
                                 f"got {answer!r}")
    admitted, new_level, retry = answer
    if not isinstance(admitted, bool):
        raise LearnerAnswerError(f"admitted must be True or False, got {admitted!r}")
    for name, value in (("new_level", new_level), ("retry_after_s", retry)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise LearnerAnswerError(f"{name} must be a number, got {value!r}")
    return admitted, float(new_level), float(retry)


class LearnerBucket(TokenBucket):
    """`TokenBucket`'s interface with every decision made by the learner's function: a refill is
    a take of 0 tokens after the elapsed time; "how long until" and "take" are takes with no
    time elapsed."""

    fn: Take  # set on a subclass made per check

    def refill(self, now: float) -> None:
        if now > self.updated:
            _, self.level, _ = _call(self.fn, self.level, self.capacity, self.rate, now - self.updated, 0)
            self.updated = now

    def seconds_until(self, amount: float) -> float:
        admitted, _, retry = _call(self.fn, self.level, self.capacity, self.rate, 0.0, amount)
        return 0.0 if admitted else max(retry, 1e-12)  # a refusal with no wait would loop

    def take(self, amount: float) -> None:
        admitted, self.level, _ = _call(self.fn, self.level, self.capacity, self.rate, 0.0, amount)


def learner_bucket_type(fn: Take) -> type[LearnerBucket]:
    return type("YourBucket", (LearnerBucket,), {"fn": staticmethod(fn)})


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Event:
    time_s: float
    key: str
    action: str  # "admit", "settle" (uses `used`) or "refund"
    tokens: int = 0
    used: int = 0


LIMITS = {"chat": RateLimits(requests_per_minute=30, tokens_per_minute=2000),
          "batch": RateLimits(tokens_per_minute=600),
          "tiny": RateLimits(requests_per_minute=3)}


def recorded_traffic(seed: int = 10) -> list[Event]:
    """A fixed mix of traffic: bursts, idle gaps (a minute and more), small and huge requests
    (some above a whole limit), each admitted request later settled or refunded."""
    rng = random.Random(seed)
    events, t, open_ = [], 0.0, []
    for i in range(160):
        t += rng.choice([0.0, 0.0, 0.05, 0.3, 1.5, 4.0]) if i % 40 else 75.0  # an idle gap every 40
        key = rng.choice(list(LIMITS))
        tokens = rng.choice([5, 20, 60, 150, 400, 900, 2500])
        events.append(Event(t, key, "admit", tokens))
        open_.append((key, tokens))
        if open_ and rng.random() < 0.5:
            key_done, reserved = open_.pop(0)
            if rng.random() < 0.2:
                events.append(Event(t, key_done, "refund", reserved))
            else:
                events.append(Event(t, key_done, "settle", reserved, used=rng.randint(0, reserved)))
    return events


@dataclass
class Outcome:
    admitted: bool
    retry_after_s: float
    tokens_left: float | None
    requests_left: float | None


def _levels(limiter: RateLimiter, key: str) -> tuple[float | None, float | None]:
    buckets = limiter._states.get(key, {})  # kind -> bucket, for the kinds the key limits
    return tuple(buckets[kind].level if kind in buckets else None
                 for kind in ("tokens", "requests"))


def replay(limiter: RateLimiter, clock: Clock, events: list[Event]):
    """Yield (event, Outcome or None) for every event, in order (settles and refunds: None)."""
    reservations: dict[str, list] = {}
    for event in events:
        clock.now = event.time_s
        if event.action == "admit":
            try:
                reservation = limiter.admit(event.key, event.tokens)
            except RateLimitExceeded as e:
                tokens, requests = _levels(limiter, event.key)
                yield event, Outcome(False, e.retry_after_s if e.retry_after_s is not None else math.inf, tokens, requests)
                continue
            reservations.setdefault(event.key, []).append(reservation)
            tokens, requests = _levels(limiter, event.key)
            yield event, Outcome(True, 0.0, tokens, requests)
        else:
            pending = [r for r in reservations.get(event.key, []) if not r.closed]
            if pending:
                if event.action == "settle":
                    limiter.settle(pending[0], event.used)
                else:
                    limiter.refund(pending[0])
            yield event, None


def _near(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def usual_mistake(fn: Take) -> str | None:
    """Probe the learner's function on three small cases that each of the usual mistakes gets
    wrong; None when it gets them right (the replay's own words then say what differs)."""
    capacity, rate = 100, 2.0
    _, level, _ = _call(fn, 50.0, capacity, rate, 1000.0, 0)
    if level > capacity + 1e-6:
        return (f"after a long idle gap your bucket holds {level:g} tokens, more than its capacity {capacity}: "
                f"refill only up to the capacity (the largest burst a key may send)")
    _, level, _ = _call(fn, 0.0, capacity, rate, 10.0, 0)
    if abs(level - 20.0) > 1e-6:
        return (f"an empty bucket of rate {rate:g}/s should hold 20 tokens 10 s later; yours holds {level:g}: "
                f"does your bucket refill with the elapsed time, at rate_per_s per second?")
    admitted, level, _ = _call(fn, 10.0, capacity, rate, 0.0, 50)
    if admitted or level < 0:
        return (f"with 10 tokens in the bucket, a request for 50 was {'admitted' if admitted else 'refused'} and "
                f"the bucket went to {level:g}: a request is admitted only if its whole reservation is there, "
                f"and a refusal takes nothing (a bucket never goes negative)")
    return None


def reference_take(level: float, capacity: int, rate: float, elapsed: float, amount: float) -> tuple[bool, float, float]:
    """The package's `TokenBucket` answering one call of `take_from_bucket`: refill, then decide."""
    bucket = TokenBucket(capacity, now=0.0)
    bucket.rate, bucket.level = rate, level
    bucket.refill(elapsed)
    wait = bucket.seconds_until(amount)
    if wait == 0.0:
        bucket.take(amount)
        return True, bucket.level, 0.0
    return False, bucket.level, wait


def edge_case_mistake(fn: Take) -> str | None:
    """The edges the limiter's own calls never reach (it refills with amount 0, then takes with no
    time elapsed): a request and a refill in one call, an amount of exactly the capacity or
    exactly the refilled level, the state after a refusal.  None when every answer matches."""
    capacity, rate = 100, 2.0
    for level in (0.0, 30.0, 100.0):
        for elapsed in (0.0, 10.0, 35.0, 1000.0):
            for amount in (0, 20, 50, 100, 101):
                want = reference_take(level, capacity, rate, elapsed, amount)
                got = _call(fn, level, capacity, rate, elapsed, amount)
                if got[0] == want[0] and _near(got[1], want[1]) and _near(got[2], want[2]):
                    continue
                call = f"take_from_bucket({level:g}, {capacity}, {rate:g}, {elapsed:g}, {amount})"
                refilled = min(capacity, level + elapsed * rate)
                told = f"{call} returned {got}, the reference {want}"
                if amount == capacity and (want[0] != got[0] or math.isinf(got[2]) != math.isinf(want[2])):
                    return (f"{told}: a request of exactly the capacity ({capacity}) fits a full bucket (so its "
                            f"wait is finite); only a request larger than the capacity can never be admitted")
                if want[0] != got[0] and elapsed > 0 and (level >= amount) != (refilled >= amount):
                    return (f"{told}: the bucket held {level:g}, and {elapsed:g} s at {rate:g}/s refilled it to "
                            f"{refilled:g} before the request arrived: refill first, then decide on the level")
                if not want[0] and not got[0] and not _near(got[1], want[1]):
                    return (f"{told}: after a refusal the bucket keeps what it holds, refilled ({refilled:g}): "
                            f"a refusal takes nothing and loses nothing")
                return told
    return None


def diagnose(event: Event, want: Outcome, got: Outcome, capacity: int) -> str:
    """The first disagreement, in words, with the usual mistake it points to."""
    where = f"at t = {event.time_s:g} s, key {event.key!r} asked for {event.tokens} tokens"
    if got.tokens_left is not None and got.tokens_left > capacity + 1e-6:
        return (f"{where}: your bucket holds {got.tokens_left:.1f} tokens, more than its capacity {capacity}: "
                f"a long idle gap must refill it only up to the capacity (the largest burst a key may send)")
    if got.tokens_left is not None and got.tokens_left < -1e-6:
        return (f"{where}: your bucket went negative ({got.tokens_left:.1f}): a request is admitted only if "
                f"its whole reservation is in the bucket")
    if want.admitted and not got.admitted:
        return (f"{where}: the reference admits it, yours refuses (says wait {got.retry_after_s:g} s): does your "
                f"bucket refill with the elapsed time, at rate_per_s per second?")
    if got.admitted and not want.admitted:
        return (f"{where}: the reference refuses it (wait {want.retry_after_s:g} s), yours admits it "
                f"(your bucket then holds {got.tokens_left}); a refusal must take nothing")
    if not _near(got.retry_after_s, want.retry_after_s):
        if math.isinf(want.retry_after_s):
            return (f"{where}: more than the whole capacity ({capacity}) can never be admitted: retry_after_s "
                    f"should be math.inf, yours says {got.retry_after_s:g} s")
        return (f"{where}: refused by both, but the wait differs: reference {want.retry_after_s:.4f} s, yours "
                f"{got.retry_after_s:.4f} s; a client needs to wait only for the *missing* tokens to refill")
    return (f"{where}: both {'admit' if want.admitted else 'refuse'} it, but the tokens left differ: reference "
            f"{want.tokens_left}, yours {got.tokens_left}")


def _is_package_code(fn) -> bool:
    """A function or bound method of this package (e.g. a TokenBucket's own methods)."""
    if (getattr(fn, "__module__", None) or "").startswith("minilm_engine"):
        return True
    owner = getattr(fn, "__self__", None)
    return owner is not None and type(owner).__module__.startswith("minilm_engine")


@dataclass
class BucketExercise:
    name: str = "take_from_bucket"

    def check(self, fn: Take, serve: bool = True) -> CheckResult:
        if not callable(fn):
            return CheckResult(False, 0, f"pass your function itself, got {type(fn).__name__}")
        if _is_package_code(fn):
            return CheckResult(False, 0, "that is the package's own code: write take_from_bucket yourself "
                                         "(refill for the elapsed time, capped; admit only if the whole amount is there)")
        events = recorded_traffic()
        ref_clock, your_clock = Clock(), Clock()
        reference = RateLimiter(keys=LIMITS, clock=ref_clock)
        yours = RateLimiter(keys=LIMITS, clock=your_clock, bucket_type=learner_bucket_type(fn))
        checked = 0
        try:
            for (event, want), (_, got) in zip(replay(reference, ref_clock, events), replay(yours, your_clock, events)):
                if want is None:
                    continue
                checked += 1
                same = (want.admitted == got.admitted and _near(got.retry_after_s, want.retry_after_s)
                        and _near(got.tokens_left, want.tokens_left) and _near(got.requests_left, want.requests_left))
                if not same:
                    limits = LIMITS[event.key]
                    capacity = limits.tokens_per_minute or limits.requests_per_minute
                    mistake = usual_mistake(fn)
                    where = f"at t = {event.time_s:g} s (key {event.key!r}, {event.tokens} tokens) the limiters disagree"
                    return CheckResult(False, checked, f"{where}: {mistake}" if mistake
                                       else diagnose(event, want, got, capacity))
            edge = edge_case_mistake(fn)  # what the limiter's calls never ask: refill and take in one call
        except NotImplementedError:
            return CheckResult(False, 0, "take_from_bucket is not written yet (it raises NotImplementedError)")
        except LearnerAnswerError as e:
            return CheckResult(False, checked, str(e))
        if edge is not None:
            return CheckResult(False, checked, edge)
        message = f"the real RateLimiter with your bucket decided all {checked} recorded requests as the reference did"
        if serve:
            served = self._serve_check(fn)
            if served is not None:
                return CheckResult(False, checked, message + f"; but over HTTP: {served}")
            message += ", and a real server with it answered 200s and 429s as the reference server does"
        return CheckResult(True, checked, message)

    def _serve_check(self, fn: Take) -> str | None:
        """The shipped chef behind `serve`'s app with the learner's limiter: the same requests as
        against the reference limiter give the same status codes, and no KV block stays held."""
        import httpx

        from minilm_engine.course.experiments.server_thread import ServerThread
        from minilm_engine.entrypoints.llm import LLM

        limits = RateLimits(tokens_per_minute=120)
        body = {"model": "noodle-chef", "prompt": "Receipt #12\n", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
        codes = {}
        for label, bucket in (("reference", TokenBucket), ("yours", learner_bucket_type(fn))):
            clock = Clock()
            limiter = RateLimiter(limits, clock=clock, bucket_type=bucket)
            llm = LLM("noodle-chef", device="cpu", record_trace=False, max_num_seqs=2)
            with ServerThread(llm, rate_limiter=limiter) as server:
                codes[label] = []
                for step in range(5):
                    clock.now = 10.0 * step  # 20 tokens refill between requests
                    reply = httpx.post(server.url + "/v1/completions", json=body, timeout=60,
                                       headers={"Authorization": "Bearer learner"})
                    codes[label].append(reply.status_code)
                held = server.engine.stats.num_used_blocks
            if held:
                return f"{held} KV blocks still held after the requests with {label} limiter"
        if codes["yours"] != codes["reference"]:
            return f"status codes {codes['yours']}, the reference server's {codes['reference']}"
        return None

    def hint(self) -> str:
        return ("Think of the bucket as water: it drips in at rate_per_s while time passes, but it cannot hold "
                "more than it can hold. A request may drink only if all it asks for is there; if it is not, "
                "it drinks nothing, and the wait is how long the drip takes to make up what is missing. "
                "Some requests are bigger than the bucket itself.")


bucket_exercise = BucketExercise()
