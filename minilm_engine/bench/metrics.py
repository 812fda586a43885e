"""From raw per-request timestamps to the numbers a serving benchmark reports.

Contract: `RequestResult` holds what the client saw of one request (when it was sent, when each
streamed chunk arrived, how many tokens); `summarize(results, duration_s, slo)` turns a list of
them into `BenchmarkMetrics`: request and token throughput, TTFT / TPOT / ITL / E2E mean,
median, P90 and P99 (milliseconds), and goodput, the rate of requests that met every SLO.
Definitions follow `vllm bench serve`:

    TTFT  first chunk - sent                       (queueing + prefill, as the user sees it)
    ITL   each gap between two chunks               (one value per gap, pooled over requests)
    TPOT  (E2E - TTFT) / (output tokens - 1)        (per request, then summarized)
    E2E   last chunk - sent
    goodput = requests meeting all SLOs / duration  (an SLO is a bound on TTFT, TPOT or E2E)

Percentiles are numpy's default (linear interpolation between order statistics).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

SLO_METRICS = ("ttft", "tpot", "e2el")  # what --goodput may bound, in milliseconds
PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    """One request as the client saw it (times: time.perf_counter seconds)."""

    success: bool = False
    sent_time: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # arrival of each streamed chunk with text
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    generated_text: str = ""
    error: str = ""

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.sent_time if self.chunk_times else None

    @property
    def e2e_latency(self) -> float | None:
        return self.chunk_times[-1] - self.sent_time if self.chunk_times else None

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None for a single-token answer)."""
        if self.num_output_tokens < 2 or not self.chunk_times:
            return None
        return (self.e2e_latency - self.ttft) / (self.num_output_tokens - 1)


@dataclass
class Summary:
    """mean / median / P90 / P99 of one latency, in milliseconds (None without samples)."""

    mean: float | None
    median: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, seconds: list[float]) -> Summary:
        if not seconds:
            return cls(None, None, None, None)
        ms = np.asarray(seconds, dtype=float) * 1000
        p50, p90, p99 = (float(v) for v in np.percentile(ms, PERCENTILES))
        return cls(float(ms.mean()), p50, p90, p99)


@dataclass
class BenchmarkMetrics:
    num_completed: int
    num_failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # completed requests / s
    output_throughput: float  # output tokens / s
    total_token_throughput: float  # (input + output) tokens / s
    goodput: float | None  # requests / s that met every SLO (None: no SLO given)
    ttft_ms: Summary
    tpot_ms: Summary
    itl_ms: Summary
    e2el_ms: Summary

    def to_dict(self) -> dict:
        return asdict(self)


def parse_slo(items: list[str] | None) -> dict[str, float]:
    """["ttft:500", "tpot:50"] -> {"ttft": 500.0, "tpot": 50.0}; raises ValueError if malformed."""
    slo: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"a goodput SLO is NAME:MILLISECONDS with NAME one of {SLO_METRICS}, got {item!r}")
        try:
            bound = float(value)
        except ValueError:
            raise ValueError(f"the bound of {item!r} is not a number of milliseconds") from None
        if not bound > 0:
            raise ValueError(f"the bound of {item!r} must be > 0 ms")
        slo[name] = bound
    return slo


def meets_slo(result: RequestResult, slo: dict[str, float]) -> bool:
    """True if a successful request is within every bound of `slo` (milliseconds)."""
    if not result.success:
        return False
    values = {"ttft": result.ttft, "tpot": result.tpot, "e2el": result.e2e_latency}
    for name, bound in slo.items():
        value = values[name]
        if value is not None and value * 1000 > bound:
            return False
    return True


def summarize(results: list[RequestResult], duration_s: float, slo: dict[str, float] | None = None) -> BenchmarkMetrics:
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    done = [r for r in results if r.success]
    input_tokens = sum(r.num_prompt_tokens for r in done)
    output_tokens = sum(r.num_output_tokens for r in done)
    goodput = None
    if slo:
        goodput = sum(meets_slo(r, slo) for r in done) / duration_s
    return BenchmarkMetrics(
        num_completed=len(done),
        num_failed=len(results) - len(done),
        duration_s=duration_s,
        total_input_tokens=input_tokens,
        total_output_tokens=output_tokens,
        request_throughput=len(done) / duration_s,
        output_throughput=output_tokens / duration_s,
        total_token_throughput=(input_tokens + output_tokens) / duration_s,
        goodput=goodput,
        ttft_ms=Summary.of([r.ttft for r in done if r.ttft is not None]),
        tpot_ms=Summary.of([r.tpot for r in done if r.tpot is not None]),
        itl_ms=Summary.of([gap for r in done for gap in r.itls]),
        e2el_ms=Summary.of([r.e2e_latency for r in done if r.e2e_latency is not None]),
    )
