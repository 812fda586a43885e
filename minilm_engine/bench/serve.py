"""The load generator behind `minilm-engine bench serve` (like `vllm bench serve`; flags in cli.py).

Contract: `run_benchmark(config, requests)` sends `requests` (datasets.py) to `config.base_url`
at `request_rate` requests/s (gamma gaps of shape `burstiness`: 1 is Poisson, < 1 burstier) or
as fast as `max_concurrency` allows, retrying refusals up to `max_retries` times (client.py),
and returns a `BenchResult`: per-request timestamps and their `BenchmarkMetrics` (metrics.py).
With `initial_test`, as vLLM, one request goes alone first (and `num_warmups` copies), so a lazy
server is not measured cold; a failed test raises ValueError.  It speaks only the OpenAI
protocol over HTTP, so it measures any server.  `sweep` repeats it over several rates.

    arrivals (Poisson, rate λ)     |   |  | |     |  |   |        gaps ~ Exp(λ)  (gamma, shape b)
    each request                   sent ──TTFT──▶ chunk ─ITL─▶ chunk ... ▶ last   (E2E)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone

import numpy as np

from minilm_engine.bench.client import RetryPolicy, retry_after_of, with_retries
from minilm_engine.bench.datasets import BenchRequest
from minilm_engine.bench.metrics import LATENCY_METRICS, BenchmarkMetrics, RequestResult, summarize

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


@dataclass
class BenchConfig:
    base_url: str
    model: str
    endpoint: str = "/v1/completions"
    request_rate: float = math.inf  # requests/s; inf: all at once (bounded by max_concurrency)
    burstiness: float = 1.0  # gamma shape of the gaps: 1 = Poisson
    max_concurrency: int | None = None
    api_key: str | None = None
    temperature: float = 0.0
    ignore_eos: bool = False  # vLLM's extension: produce exactly max_tokens
    stream: bool = True
    slo: dict[str, float] = field(default_factory=dict)  # {"ttft": ms, "tpot": ms, "e2el": ms}
    timeout_s: float = 600.0
    seed: int = 0
    extra_body: dict = field(default_factory=dict)  # merged into every request body (vLLM's --extra-body)
    backend: str = "openai"  # vLLM's name of the client: openai, vllm (completions), openai-chat
    label: str | None = None
    # What the report and the JSON give for each latency (vLLM's --percentile-metrics, --metric-percentiles).
    percentile_metrics: tuple[str, ...] = LATENCY_METRICS
    metric_percentiles: tuple[float, ...] = (90, 99)
    # Before the clock starts: one request alone (retried while the server is unreachable), then warm-ups.
    initial_test: bool = False
    ready_timeout_s: float = 600.0
    num_warmups: int = 0
    # A client that copes (client.py): retries on 429 / 503 / no answer; 0 = one try (vLLM's).
    max_retries: int = 0
    retry_base_delay_s: float = 0.5
    retry_max_delay_s: float = 30.0

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(self.max_retries, self.retry_base_delay_s, self.retry_max_delay_s)

    def __post_init__(self) -> None:
        _ = self.retry_policy  # raises ValueError for bad retry fields
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {ENDPOINTS}, got {self.endpoint!r}")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 (inf: all at once), got {self.request_rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.num_warmups < 0:
            raise ValueError(f"num_warmups must be >= 0, got {self.num_warmups}")
        unknown = [m for m in self.percentile_metrics if m not in LATENCY_METRICS]
        if unknown:
            raise ValueError(f"percentile_metrics must be among {LATENCY_METRICS}, got {unknown}")


@dataclass
class BenchResult:
    config: BenchConfig
    metrics: BenchmarkMetrics
    results: list[RequestResult]
    start_time: float  # perf_counter when the first request was due

    def to_dict(self, detailed: bool = True) -> dict:
        """The JSON result with `vllm bench serve`'s keys (`duration`, `completed`, `mean_ttft_ms`,
        `p99_ttft_ms`, ...; None without samples); `detailed` adds the per-request lists (a
        failed request has TTFT 0 and no ITLs, as vLLM writes them)."""
        c, m = self.config, self.metrics
        settings = {k: v for k, v in asdict(c).items()
                    if k in ("base_url", "endpoint", "burstiness", "max_concurrency", "temperature", "ignore_eos",
                             "stream", "slo", "seed", "num_warmups", "max_retries")}
        out = {
            "date": datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"),
            "endpoint_type": c.backend,
            "backend": c.backend,
            "label": c.label,
            "model_id": c.model,
            "num_prompts": len(self.results),
            "request_rate": json_rate(c.request_rate),
            **settings,
            "duration": m.duration_s,
            "completed": m.num_completed,
            "failed": m.num_failed,
            "total_input_tokens": m.total_input_tokens,
            "total_output_tokens": m.total_output_tokens,
            "request_throughput": m.request_throughput,
            "request_goodput": m.goodput,
            "output_throughput": m.output_throughput,
            "total_token_throughput": m.total_token_throughput,
            "max_output_tokens_per_s": m.max_output_tokens_per_s,
            "max_concurrent_requests": m.max_concurrent_requests,
            "total_retries": sum(r.num_retries for r in self.results),
        }
        for name in c.percentile_metrics:
            summary = m.latency(name)
            out[f"mean_{name}_ms"] = summary.mean
            out[f"median_{name}_ms"] = summary.median
            out[f"std_{name}_ms"] = summary.std
            for p in c.metric_percentiles:
                out[f"p{percentile_word(p)}_{name}_ms"] = summary.percentiles.get(float(p))
        if detailed:
            out.update({
                "input_lens": [r.num_prompt_tokens for r in self.results],
                "output_lens": [r.num_output_tokens if r.success else 0 for r in self.results],
                "ttfts": [r.ttft if r.success else 0.0 for r in self.results],
                "itls": [r.itls if r.success else [] for r in self.results],
                "e2els": [r.e2e_latency if r.success else 0.0 for r in self.results],
                "generated_texts": [r.generated_text for r in self.results],
                "errors": [r.error for r in self.results],
                "retries": [r.num_retries for r in self.results],
                "sent_times": [r.sent_time - self.start_time for r in self.results],
            })
        return out


def percentile_word(p: float) -> str:
    """99.0 -> "99", 99.9 -> "99.9": how vLLM names a percentile in its keys and labels."""
    return str(int(p)) if int(p) == p else str(p)


def json_rate(rate: float) -> float | str:
    return "inf" if math.isinf(rate) else rate


def arrival_offsets(num_requests: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """When each request is due, in seconds after the start: cumulative gamma gaps of mean
    1 / request_rate (shape `burstiness`; 1 is exponential, i.e. Poisson arrivals)."""
    if math.isinf(request_rate):
        return np.zeros(num_requests)
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests)
    gaps[0] = 0.0  # the first request starts the clock
    return np.cumsum(gaps)


def _payload(config: BenchConfig, request: BenchRequest) -> dict:
    body = {"model": config.model, "max_tokens": request.max_tokens, "temperature": config.temperature,
            "stream": config.stream, **config.extra_body}
    if config.stream:
        body["stream_options"] = {"include_usage": True}
    if config.ignore_eos:
        body["ignore_eos"] = True
    if config.endpoint == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = request.prompt
    return body


def _text_of(choice: dict, chat: bool) -> str:
    if chat:
        return (choice.get("delta") or choice.get("message") or {}).get("content") or ""
    return choice.get("text") or ""


async def send_request(client, config: BenchConfig, request: BenchRequest) -> RequestResult:
    """Send one request, streaming; never raises (a failure is recorded in the result)."""
    chat = config.endpoint == "/v1/chat/completions"
    result = RequestResult(sent_time=time.perf_counter())
    pieces: list[str] = []
    usage = None
    try:
        async with client.stream("POST", config.base_url.rstrip("/") + config.endpoint,
                                 json=_payload(config, request)) as response:
            result.http_status = response.status_code
            if response.status_code != 200:
                result.retry_after_s = retry_after_of(response.headers)
                body = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {body[:500]}"
                return result
            if not config.stream:
                data = json.loads(await response.aread())
                result.chunk_times.append(time.perf_counter())
                pieces.append(_text_of(data["choices"][0], chat))
                usage = data.get("usage")
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        result.error = str(chunk["error"])
                        return result
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    text = "".join(_text_of(c, chat) for c in chunk.get("choices") or [])
                    if text:
                        result.chunk_times.append(time.perf_counter())
                        pieces.append(text)
    except Exception as e:  # connection refused, timeout, malformed stream: a failed request
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.generated_text = "".join(pieces)
    if usage:
        result.num_prompt_tokens = int(usage.get("prompt_tokens") or 0)
        result.num_output_tokens = int(usage.get("completion_tokens") or 0)
    else:  # a server that reports no usage: count chunks (one token each, for most servers)
        result.num_output_tokens = len(result.chunk_times)
    result.success = bool(result.chunk_times)
    if not result.success:
        result.error = NO_TEXT
    return result


NO_TEXT = "the server answered no text"


async def initial_test(client, config: BenchConfig, request: BenchRequest, retry_interval_s: float = 1.0) -> RequestResult:
    """Send `request` alone before a timed run (as vLLM does), retried until
    `config.ready_timeout_s` while the server cannot answer (unreachable, a 5xx, a 429); any
    other failure raises ValueError.  A complete answer with no text passes (a sampled model may
    end on its first token)."""
    deadline = time.monotonic() + config.ready_timeout_s
    while True:
        result = await send_request(client, config, request)
        if result.success or (result.http_status == 200 and not result.chunk_times and result.error == NO_TEXT):
            return result
        not_up = result.http_status is None or result.http_status >= 500 or result.http_status == 429
        wait = max(retry_interval_s, result.retry_after_s or 0.0)
        if not not_up or time.monotonic() + wait > deadline:
            raise ValueError(f"the initial test request failed, so the benchmark did not start (check "
                             f"--base-url, --model and the other arguments): {result.error}")
        await asyncio.sleep(wait)


async def run_benchmark_async(config: BenchConfig, requests: list[BenchRequest],
                              on_result: Callable[[RequestResult], None] | None = None,
                              progress: bool = True) -> BenchResult:
    import httpx
    from tqdm.auto import tqdm

    if not requests:
        raise ValueError("no requests to send")
    offsets = arrival_offsets(len(requests), config.request_rate, config.burstiness, config.seed)
    limit = contextlib.nullcontext()
    if config.max_concurrency:
        limit = asyncio.Semaphore(config.max_concurrency)
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    # No connection cap of httpx's own: concurrency is what this benchmark sets.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    bar = tqdm(total=len(requests), desc=f"rate {json_rate(config.request_rate)}", unit="req",
               disable=not progress, leave=False)
    results: list[RequestResult | None] = [None] * len(requests)
    policy = config.retry_policy

    async with httpx.AsyncClient(timeout=config.timeout_s, headers=headers, limits=limits) as client:
        if config.initial_test:
            await initial_test(client, config, requests[0])
        async def warmup() -> None:
            async with limit:
                await send_request(client, config, requests[0])

        await asyncio.gather(*(warmup() for _ in range(config.num_warmups)))
        start = time.perf_counter()

        async def one(i: int) -> None:
            delay = start + offsets[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            rng = random.Random(config.seed * 1_000_003 + i)  # this request's jitter, run to run the same
            send = functools.partial(send_request, client, config, requests[i])
            async with limit:  # a request waiting to retry keeps its slot, as a real client does
                result = await with_retries(send, policy, rng)
            results[i] = result
            bar.update(1)
            if on_result is not None:
                on_result(result)

        await asyncio.gather(*(one(i) for i in range(len(requests))))
        duration = time.perf_counter() - start
    bar.close()
    done = [r for r in results if r is not None]
    return BenchResult(config, summarize(done, duration, config.slo, config.metric_percentiles), done, start)


def run_benchmark(config: BenchConfig, requests: list[BenchRequest],
                  on_result: Callable[[RequestResult], None] | None = None, progress: bool = True) -> BenchResult:
    """`run_benchmark_async` from synchronous code (see `run_sync`)."""
    return run_sync(run_benchmark_async(config, requests, on_result, progress))


def run_sync(coroutine):
    """Run a coroutine from synchronous code, on a thread of its own where a loop already runs."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    box: dict = {}

    def target():
        try:
            box["result"] = asyncio.run(coroutine)
        except BaseException as e:  # handed back to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, name="bench-serve")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def sweep(config: BenchConfig, requests: list[BenchRequest], rates: list[float], progress: bool = True) -> list[BenchResult]:
    """The same requests at each rate in turn (the initial test and warm-ups before the first)."""
    out = []
    for i, rate in enumerate(rates):
        step = replace(config, request_rate=rate)
        if i > 0:
            step = replace(step, initial_test=False, num_warmups=0)
        out.append(run_benchmark(step, requests, progress=progress))
    return out
