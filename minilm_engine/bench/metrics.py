"""From raw per-request timestamps to the numbers `vllm bench serve` reports.

Contract: `RequestResult` is what the client saw of one request; `summarize(results,
duration_s, slo)` gives `BenchmarkMetrics`: throughputs, each latency's mean, median, standard
deviation and percentiles (milliseconds; numpy's linear interpolation), goodput, and the peaks.

    TTFT  first chunk - sent                 ITL   each gap between two chunks (pooled)
    TPOT  (E2E - TTFT) / (output tokens - 1) E2E   last chunk - sent
    goodput = requests meeting every SLO (bounds on TTFT, TPOT, E2E) / duration
    peak    = most chunks, and most requests in flight, within one second
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

SLO_METRICS = ("ttft", "tpot", "e2el")  # what --goodput may bound, in milliseconds
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")  # vLLM's names, as in mean_ttft_ms


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
    http_status: int | None = None  # None: no answer at all (unreachable, timed out)
    retry_after_s: float | None = None  # the server's Retry-After on a refusal
    num_retries: int = 0  # tries after the first (client.py); sent_time is the first try's
    retry_wait_s: float = 0.0  # seconds spent waiting between tries

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
    """One latency in milliseconds (None without samples); `percentiles`: those asked for."""

    mean: float | None
    median: float | None
    p90: float | None
    p99: float | None
    std: float | None = None
    percentiles: dict[float, float] = field(default_factory=dict)

    @classmethod
    def of(cls, seconds: list[float], percentiles: tuple[float, ...] = (90, 99)) -> Summary:
        if not seconds:
            return cls(None, None, None, None)
        ms = np.asarray(seconds, dtype=float) * 1000
        p50, p90, p99 = (float(v) for v in np.percentile(ms, (50, 90, 99)))
        asked = {float(p): float(np.percentile(ms, p)) for p in percentiles}
        return cls(float(ms.mean()), p50, p90, p99, float(ms.std()), asked)


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
    max_output_tokens_per_s: float = 0.0  # the busiest second's chunks (tokens, for most servers)
    max_concurrent_requests: int = 0  # requests in flight during the busiest second

    def to_dict(self) -> dict:
        return asdict(self)

    def latency(self, name: str) -> Summary:
        """The summary of one of LATENCY_METRICS ("ttft" -> ttft_ms)."""
        return getattr(self, f"{name}_ms")


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


def parse_percentiles(text: str) -> tuple[float, ...]:
    """"90,99,99.9" -> (90.0, 99.0, 99.9); raises ValueError unless each is in (0, 100]."""
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise ValueError(f"percentiles are comma-separated numbers, e.g. 90,99; got {text!r}") from None
    if not all(0 < p <= 100 for p in values):
        raise ValueError(f"percentiles must be in (0, 100], got {text!r}")
    return values


def parse_metric_names(text: str) -> tuple[str, ...]:
    """"ttft,tpot,itl" -> ("ttft", "tpot", "itl"); raises ValueError for a name not in LATENCY_METRICS."""
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in LATENCY_METRICS]
    if unknown:
        raise ValueError(f"percentile metrics must be among {LATENCY_METRICS}, got {unknown}")
    return names


def peak_throughput(results: list[RequestResult]) -> tuple[float, int]:
    """(most chunks, most requests in flight) within one second, over one-second buckets from
    the first request sent, as vLLM computes its peak output throughput."""
    done = [r for r in results if r.success and r.chunk_times]
    if not done:
        return 0.0, 0
    start = min(r.sent_time for r in done)
    num_seconds = int(np.ceil(max(r.chunk_times[-1] for r in done) - start)) + 1
    chunks, in_flight = np.zeros(num_seconds), np.zeros(num_seconds)
    for r in done:
        for t in r.chunk_times:
            chunks[int(t - start)] += 1
        in_flight[int(r.sent_time - start): int(r.chunk_times[-1] - start) + 1] += 1
    return float(chunks.max()), int(in_flight.max())


def summarize(results: list[RequestResult], duration_s: float, slo: dict[str, float] | None = None,
              percentiles: tuple[float, ...] = (90, 99)) -> BenchmarkMetrics:
    """The metrics of a run; `percentiles`: the ones each Summary keeps besides P90 and P99."""
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    done = [r for r in results if r.success]
    input_tokens = sum(r.num_prompt_tokens for r in done)
    output_tokens = sum(r.num_output_tokens for r in done)
    goodput = None
    if slo:
        goodput = sum(meets_slo(r, slo) for r in done) / duration_s
    peak_chunks, peak_in_flight = peak_throughput(done)
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
        ttft_ms=Summary.of([r.ttft for r in done if r.ttft is not None], percentiles),
        tpot_ms=Summary.of([r.tpot for r in done if r.tpot is not None], percentiles),
        itl_ms=Summary.of([gap for r in done for gap in r.itls], percentiles),
        e2el_ms=Summary.of([r.e2e_latency for r in done if r.e2e_latency is not None], percentiles),
        max_output_tokens_per_s=peak_chunks,
        max_concurrent_requests=peak_in_flight,
    )
