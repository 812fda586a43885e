"""`minilm-engine bench serve`: a load generator for any OpenAI-compatible server (like `vllm bench serve`).

Contract: `run_benchmark(config, requests)` sends `requests` (datasets.py) to
`config.base_url` at `config.request_rate` requests/s (Poisson arrivals; `burstiness` != 1
draws gamma gaps of the same mean: < 1 burstier, > 1 more regular) or as fast as
`max_concurrency` allows, streams every answer, and returns a `BenchResult`: the raw
per-request timestamps and their `BenchmarkMetrics` (metrics.py).  It speaks only the OpenAI
protocol over HTTP (httpx), so the same run measures this package's server, vLLM, SGLang,
`transformers serve`, or a hosted endpoint.  `sweep` repeats it over several rates: the
throughput-latency curve.

    arrivals (Poisson, rate λ)     |   |  | |     |  |   |        gaps ~ Exp(λ)  (gamma, shape b)
    each request                   sent ──TTFT──▶ chunk ─ITL─▶ chunk ... ▶ last   (E2E)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from .datasets import BenchRequest, jsonl_requests, noodle_requests
from .metrics import BenchmarkMetrics, RequestResult, parse_slo, summarize

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

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {ENDPOINTS}, got {self.endpoint!r}")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 (inf: all at once), got {self.request_rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")


@dataclass
class BenchResult:
    config: BenchConfig
    metrics: BenchmarkMetrics
    results: list[RequestResult]
    start_time: float  # perf_counter when the first request was due

    def to_dict(self) -> dict:
        """The JSON result file: settings, metrics, and the raw per-request numbers."""
        config = asdict(self.config)
        config.pop("api_key")
        config["request_rate"] = _json_rate(self.config.request_rate)
        ok = [r for r in self.results if r.success]
        return {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **config,
            "num_prompts": len(self.results),
            **self.metrics.to_dict(),
            "input_lens": [r.num_prompt_tokens for r in ok],
            "output_lens": [r.num_output_tokens for r in ok],
            "ttfts": [r.ttft for r in ok],
            "itls": [r.itls for r in ok],
            "e2els": [r.e2e_latency for r in ok],
            "sent_times": [r.sent_time - self.start_time for r in self.results],
            "errors": [r.error for r in self.results if not r.success],
        }


def _json_rate(rate: float) -> float | str:
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
            "stream": config.stream}
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
            if response.status_code != 200:
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
        result.error = "the server answered no text"
    return result


async def run_benchmark_async(config: BenchConfig, requests: list[BenchRequest],
                              on_result: Callable[[RequestResult], None] | None = None,
                              progress: bool = True) -> BenchResult:
    import httpx
    from tqdm.auto import tqdm

    if not requests:
        raise ValueError("no requests to send")
    offsets = arrival_offsets(len(requests), config.request_rate, config.burstiness, config.seed)
    limit = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    # No connection cap of httpx's own: concurrency is what this benchmark sets.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    bar = tqdm(total=len(requests), desc=f"rate {_json_rate(config.request_rate)}", unit="req",
               disable=not progress, leave=False)
    results: list[RequestResult | None] = [None] * len(requests)

    async with httpx.AsyncClient(timeout=config.timeout_s, headers=headers, limits=limits) as client:
        start = time.perf_counter()

        async def one(i: int) -> None:
            delay = start + offsets[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if limit is not None:
                async with limit:
                    result = await send_request(client, config, requests[i])
            else:
                result = await send_request(client, config, requests[i])
            results[i] = result
            bar.update(1)
            if on_result is not None:
                on_result(result)

        await asyncio.gather(*(one(i) for i in range(len(requests))))
        duration = time.perf_counter() - start
    bar.close()
    done = [r for r in results if r is not None]
    return BenchResult(config, summarize(done, duration, config.slo), done, start)


def run_benchmark(config: BenchConfig, requests: list[BenchRequest],
                  on_result: Callable[[RequestResult], None] | None = None, progress: bool = True) -> BenchResult:
    """`run_benchmark_async` from synchronous code (see `run_sync`)."""
    return run_sync(run_benchmark_async(config, requests, on_result, progress))


def run_sync(coroutine):
    """Run a coroutine to completion from synchronous code, also where an event loop already
    runs (a notebook): then it runs on a thread of its own."""
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
    """The same requests at each rate in turn: a throughput-latency curve."""
    out = []
    for rate in rates:
        step = BenchConfig(**{**asdict(config), "request_rate": rate})
        out.append(run_benchmark(step, requests, progress=progress))
    return out


# -- the command line ---------------------------------------------------------------------------


def format_report(result: BenchResult) -> str:
    m, c = result.metrics, result.config
    lines = [
        f"{' Serving Benchmark Result ':=^60}",
        f"{'Endpoint:':<40}{c.base_url.rstrip('/') + c.endpoint}",
        f"{'Request rate (req/s):':<40}{_json_rate(c.request_rate)}",
        f"{'Max concurrency:':<40}{c.max_concurrency}",
        f"{'Successful requests:':<40}{m.num_completed}",
        f"{'Failed requests:':<40}{m.num_failed}",
        f"{'Benchmark duration (s):':<40}{m.duration_s:.2f}",
        f"{'Total input tokens:':<40}{m.total_input_tokens}",
        f"{'Total generated tokens:':<40}{m.total_output_tokens}",
        f"{'Request throughput (req/s):':<40}{m.request_throughput:.2f}",
        f"{'Output token throughput (tok/s):':<40}{m.output_throughput:.2f}",
        f"{'Total token throughput (tok/s):':<40}{m.total_token_throughput:.2f}",
    ]
    if m.goodput is not None:
        lines.append(f"{'Request goodput (req/s):':<40}{m.goodput:.2f}")
    for title, summary in (("Time to First Token", m.ttft_ms), ("Time per Output Token (excl. 1st token)", m.tpot_ms),
                           ("Inter-token Latency", m.itl_ms), ("End-to-end Latency", m.e2el_ms)):
        lines.append(f"{title:-^60}")
        for name, value in (("Mean", summary.mean), ("Median", summary.median), ("P90", summary.p90), ("P99", summary.p99)):
            lines.append(f"{name + ' (ms):':<40}{'-' if value is None else f'{value:.2f}'}")
    errors = sorted({r.error for r in result.results if not r.success})
    if errors:
        lines.append(f"first errors: {errors[:3]}")
    lines.append("=" * 60)
    return "\n".join(lines)


def format_sweep(results: list[BenchResult]) -> str:
    header = f"{'rate':>8} {'req/s':>7} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'goodput':>8}"
    rows = [header]
    for r in results:
        m = r.metrics

        def f(v):
            return "-" if v is None else f"{v:.1f}"
        rows.append(f"{str(_json_rate(r.config.request_rate)):>8} {m.request_throughput:>7.2f} {m.output_throughput:>8.1f} "
                    f"{f(m.ttft_ms.median):>9} {f(m.ttft_ms.p99):>9} {f(m.itl_ms.median):>8} {f(m.itl_ms.p99):>8} "
                    f"{f(m.goodput) if m.goodput is not None else '-':>8}")
    return "\n".join(rows)


def _rate(text: str) -> float:
    value = float(text)  # "inf" parses too
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a request rate must be > 0 (or inf), got {text}")
    return value


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    bench = subparsers.add_parser("bench", help="benchmarks (bench serve: load-test an OpenAI-compatible server)")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    p = kinds.add_parser("serve", help="load-test an OpenAI-compatible server (ours, vLLM, any)",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server, without /v1")
    p.add_argument("--model", required=True, help="the model name the server knows (GET /v1/models)")
    p.add_argument("--endpoint", default="/v1/completions", choices=ENDPOINTS)
    p.add_argument("--api-key", default=None)
    p.add_argument("--dataset", default="noodle", help="'noodle' (the shop's corpus) or a JSONL file of {\"prompt\": ...}")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, default=None, help="prompt tokens (default: a document's first line)")
    p.add_argument("--output-len", type=int, default=32, help="max_tokens of each request")
    p.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in [L(1-r), L(1+r)]")
    p.add_argument("--tokenizer", default=None, help="to cut prompts to --input-len tokens (default: --model if it loads)")
    p.add_argument("--request-rate", type=_rate, default=math.inf, help="requests/s, Poisson (default inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps: <1 burstier, 1 Poisson")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--sweep", default=None, help="comma-separated request rates, e.g. 1,2,4,inf")
    p.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS", help="SLOs, e.g. ttft:500 tpot:50")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true", help="ask for exactly max_tokens (vLLM extension)")
    p.add_argument("--no-stream", action="store_true", help="ask for whole answers (TTFT = E2E: what the user waits)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--result-file", default=None, help="write the JSON result here")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run_bench_serve)
    return p


def _load_tokenizer(name: str | None):
    if name is None:
        return None
    try:
        from transformers import AutoTokenizer

        from ..models import resolve_model_path

        return AutoTokenizer.from_pretrained(str(resolve_model_path(name)))
    except Exception:
        return None


def requests_from_args(args: argparse.Namespace) -> list[BenchRequest]:
    if args.dataset == "noodle":
        tokenizer = _load_tokenizer(args.tokenizer or args.model) if args.input_len else None
        if args.input_len and tokenizer is None:
            print(f"[no tokenizer for {args.tokenizer or args.model!r}: prompt lengths estimated at "
                  "4 characters a token]", file=sys.stderr)
        return noodle_requests(args.num_prompts, args.output_len, args.input_len, args.range_ratio, args.seed, tokenizer)
    return jsonl_requests(args.dataset, args.num_prompts, args.output_len, args.range_ratio, args.seed)


def run_bench_serve(args: argparse.Namespace) -> int:
    try:
        config = BenchConfig(
            base_url=args.base_url, model=args.model, endpoint=args.endpoint, request_rate=args.request_rate,
            burstiness=args.burstiness, max_concurrency=args.max_concurrency, api_key=args.api_key,
            temperature=args.temperature, ignore_eos=args.ignore_eos, stream=not args.no_stream,
            slo=parse_slo(args.goodput), timeout_s=args.timeout, seed=args.seed,
        )
        rates = [_rate(r) for r in args.sweep.split(",")] if args.sweep else None
        requests = requests_from_args(args)
    except (ValueError, OSError, argparse.ArgumentTypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if rates is None:
        results = [run_benchmark(config, requests, progress=not args.no_progress)]
        print(format_report(results[0]))
    else:
        results = sweep(config, requests, rates, progress=not args.no_progress)
        for r in results:
            print(format_report(r))
        print(format_sweep(results))
    if args.result_file:
        payload = results[0].to_dict() if rates is None else {"sweep": [r.to_dict() for r in results]}
        Path(args.result_file).write_text(json.dumps(payload, indent=1))
        print(f"[result written to {args.result_file}]", file=sys.stderr)
    return 0 if all(r.metrics.num_completed > 0 for r in results) else 1
