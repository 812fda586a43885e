"""The view from outside under a rate limit: what a naive client sees against one that copes.

Contract: `client_view(...)` starts a server whose API keys are limited in tokens (per
`period_s`: a minute shortened so that a spike resolves in seconds), sends one spike of
`num_requests` requests all at once through `bench.serve` (streamed, as `minilm-engine bench
serve` sends them), first as a naive client (one try each: a 429 is a failure), then, on a fresh
key, as a client that retries 429s with Retry-After plus backoff and full jitter
(`bench/client.py`); it returns one row per client: how many completed, the 429s it saw, its
retries, and its latencies from the first try (so the waiting is in them).

    spike of N at t=0 ──> token bucket (limit per period) ──> admitted: served
                                       └──> 429 + Retry-After ──> naive: failed
                                                                 coping: wait, retry
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from ..bench.datasets import noodle_requests
from ..bench.serve import BenchConfig, BenchResult, run_benchmark
from ..entrypoints.openai import ServerThread
from ..entrypoints.rate_limit import RateLimiter, RateLimits
from ..llm import LLM


def client_row(label: str, result: BenchResult) -> dict:
    m = result.metrics
    refused = sum(r.http_status == 429 for r in result.results)  # last answer still a 429
    return {
        "client": label,
        "sent": len(result.results),
        "completed": m.num_completed,
        "failed": m.num_failed,
        "429s seen": refused + sum(r.num_retries for r in result.results),
        "retries": sum(r.num_retries for r in result.results),
        "E2E p50 ms": m.e2el_ms.median,
        "E2E p99 ms": m.e2el_ms.p99,
        "TTFT p50 ms": m.ttft_ms.median,
        "mean wait s": sum(r.retry_wait_s for r in result.results) / len(result.results),
        "duration s": m.duration_s,
    }


def client_view(
    model: str = "noodle-apprentice",
    *,
    device: str | None = None,
    tokens_per_period: int = 300,
    period_s: float = 3.0,
    num_requests: int = 32,
    max_tokens: int = 16,
    max_retries: int = 10,
    seed: int = 0,
) -> pd.DataFrame:
    """One spike, two clients (see the module doc): a table with a row for each."""
    limiter = RateLimiter(RateLimits(tokens_per_minute=tokens_per_period), period_s=period_s)
    llm = LLM(model, device=device, record_trace=False)
    requests = noodle_requests(num_requests, max_tokens, seed=seed)
    rows = []
    with ServerThread(llm, rate_limiter=limiter) as server:
        base = BenchConfig(base_url=server.url, model=server.app.state.serving.served_model_names[0],
                           ignore_eos=True, seed=seed, timeout_s=60.0)
        # Each client on its own key, so each meets a full bucket.
        for label, retries in (("naive (one try)", 0), (f"copes (up to {max_retries} retries)", max_retries)):
            config = replace(base, api_key=f"key-{label}", max_retries=retries, label=label)
            rows.append(client_row(label, run_benchmark(config, requests, progress=False)))
    table = pd.DataFrame(rows)
    table.attrs["limit"] = f"{tokens_per_period} tokens per {period_s:g} s per key"
    return table
