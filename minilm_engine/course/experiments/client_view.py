"""The view from outside under a rate limit: what a naive client sees against one that copes.

Contract: `client_view(...)` starts `minilm-engine serve` as its own process (outside_view.py's
`ServerProcess`, so the clients share nothing with it) with every API key limited in tokens
(`--rate-limit-tpm` over `--rate-limit-period`: a minute shortened so that a spike resolves in
seconds), sends one spike of
`num_requests` requests all at once through `bench.serve` (streamed, as `minilm-engine bench
serve` sends them), first as a naive client (one try each: a 429 is a failure), then, on a fresh
key, as a client that retries 429s with Retry-After plus backoff and full jitter
(`bench/client.py`); it returns one row per client: how many completed, the 429s it saw, its
retries, and its latencies from the first try (so the waiting is in them).  `spike_table(url,
model, requests)` is the two clients' part, against any server already running.

    spike of N at t=0 ──> token bucket (limit per period) ──> admitted: served
                                       └──> 429 + Retry-After ──> naive: failed
                                                                 coping: wait, retry
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from minilm_engine.bench.datasets import BenchRequest, noodle_requests
from minilm_engine.bench.serve import BenchConfig, BenchResult, run_benchmark
from minilm_engine.course.experiments.outside_view import ServerProcess


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
    device: str = "cpu",
    threads: int | None = 1,
    tokens_per_period: int = 300,
    period_s: float = 3.0,
    num_requests: int = 32,
    max_tokens: int = 16,
    max_retries: int = 10,
    seed: int = 0,
) -> pd.DataFrame:
    """One spike, two clients (see the module doc): a table with a row for each."""
    flags = ["--rate-limit-tpm", str(tokens_per_period), "--rate-limit-period", str(period_s)]
    requests = noodle_requests(num_requests, max_tokens, seed=seed)
    with ServerProcess(model, flags, device=device, threads=threads) as server:
        table = spike_table(server.url, server.served_name, requests, max_retries, seed)
    table.attrs["limit"] = f"{tokens_per_period} tokens per {period_s:g} s per key"
    return table


def spike_table(url: str, model: str, requests: list[BenchRequest], max_retries: int = 10, seed: int = 0) -> pd.DataFrame:
    """`requests` all at once, by a naive client and then by one that retries, each on a key of
    its own (so each meets a full bucket); a row for each."""
    base = BenchConfig(base_url=url, model=model, ignore_eos=True, seed=seed, timeout_s=60.0)
    rows = []
    for label, retries in (("naive (one try)", 0), (f"copes (up to {max_retries} retries)", max_retries)):
        config = replace(base, api_key=f"key-{label}", max_retries=retries, label=label)
        rows.append(client_row(label, run_benchmark(config, requests, progress=False)))
    return pd.DataFrame(rows)
