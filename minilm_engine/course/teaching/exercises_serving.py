"""Chapter 07's exercise: a load test's headline numbers from raw timestamps.

    tail_and_goodput(sent, first_token, last_token, num_output_tokens, duration_s, slo_ttft_ms, slo_tpot_ms)
        -> (p99_ttft_ms, goodput_req_per_s)

Per request i (seconds): sent[i] when it was sent, first_token[i] / last_token[i] when its
first / last token arrived, num_output_tokens[i] >= 1 tokens.  TTFT = first - sent; TPOT =
(last - first) / (tokens - 1) (no TPOT for a one-token answer: it meets any TPOT bound); P99 is
numpy's default percentile (linear between order statistics); goodput counts the requests with
TTFT <= slo_ttft_ms and TPOT <= slo_tpot_ms, per second of `duration_s`.  The stored cases
(course/teaching/fixtures/tail_and_goodput.json) are answered by the package's `bench.metrics.summarize`,
which `minilm-engine bench serve` reports with (see `engine_tail_and_goodput`).
"""

from __future__ import annotations

import math
import random

from minilm_engine.bench.metrics import RequestResult, summarize
from minilm_engine.course.teaching.exercises import Exercise


def engine_tail_and_goodput(sent, first_token, last_token, num_output_tokens, duration_s, slo_ttft_ms,
                             slo_tpot_ms) -> tuple[float, float]:
    """The answer, from the package's own `summarize`: raw timestamps as `RequestResult`s."""
    results = [RequestResult(success=True, sent_time=s, chunk_times=[f, l] if n > 1 else [f],
                             num_output_tokens=n)
               for s, f, l, n in zip(sent, first_token, last_token, num_output_tokens)]
    metrics = summarize(results, duration_s, {"ttft": slo_ttft_ms, "tpot": slo_tpot_ms})
    return metrics.ttft_ms.p99, metrics.goodput


def make_case(rng: random.Random) -> dict:
    """5-60 requests, some queued long (a heavy tail), some of one token only."""
    n = rng.choice([5, 6, 8]) if rng.random() < 0.6 else rng.choice([20, 60])  # short first failures
    sent, first, last, tokens = [], [], [], []
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(4.0)
        ttft = rng.uniform(0.02, 0.2) if rng.random() > 0.15 else rng.uniform(0.5, 3.0)  # a few waited in line
        num = 1 if rng.random() < 0.1 else rng.randint(2, 60)
        tpot = rng.uniform(0.01, 0.08)
        sent.append(round(t, 4))
        first.append(round(t + ttft, 4))
        last.append(round(t + ttft + tpot * (num - 1), 4))
        tokens.append(num)
    duration = round(max(last) - min(sent) + rng.uniform(0, 0.5), 4)
    return {"sent": sent, "first_token": first, "last_token": last, "num_output_tokens": tokens,
            "duration_s": duration, "slo_ttft_ms": rng.choice([100.0, 200.0, 500.0]),
            "slo_tpot_ms": rng.choice([30.0, 50.0, 80.0])}


def _close(got, want) -> bool:
    """(p99, goodput) pairs equal to 1e-6 relative; anything else (None, a str, one number) is
    simply not equal: the checker reports it instead of crashing."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return False
    return all(
        isinstance(g, (int, float)) and not isinstance(g, bool)
        and math.isclose(g, w, rel_tol=1e-6, abs_tol=1e-9)
        for g, w in zip(got, want)
    )


tail_and_goodput_exercise = Exercise(
    "tail_and_goodput",
    "tail_and_goodput",  # cases answered by engine_tail_and_goodput (bench.metrics.summarize)
    compare=_close,
    hint="P99: np.percentile(ttfts_ms, 99). A one-token request has no TPOT: it passes the TPOT bound. "
         "Goodput divides by duration_s, not by the number of requests.",
    shows=("minilm_engine.bench.metrics:summarize",),
    package=("minilm_engine.course.teaching.exercises_serving:engine_tail_and_goodput",),
    solutions="07_throughput_vs_latency_solutions.ipynb",
)
