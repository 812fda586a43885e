"""`minilm-engine bench serve ...`: the load generator's command line, which takes a `vllm bench
serve` command line (`--backend openai` / `vllm` / `openai-chat`, `--dataset-name random` /
`custom`) besides this package's own spellings:

    ours                 vLLM's                                 meaning
    --dataset noodle     --dataset-name noodle                  noodle-shop prompts (the default)
                         --dataset-name random                  corpus text cut to --random-input-len
    --dataset F.jsonl    --dataset-name custom --dataset-path F  one {"prompt": ...} a line
    --input-len          --random-input-len                     prompt tokens
    --output-len         --random-output-len, --custom-output-len  max_tokens
    --range-ratio        --random-range-ratio                   lengths in [L(1-r), L(1+r)]
    --result-file F      --save-result [--result-filename F] [--result-dir D]   the JSON result
    --no-progress        --disable-tqdm

`run_bench_serve(args)` prints vLLM's report and writes vLLM's JSON keys; it returns 0 when
some request completed, 1 when none did, 2 on bad arguments or a failed initial test.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import datetime
from pathlib import Path

from minilm_engine.bench.cli_types import json_object
from minilm_engine.bench.datasets import BenchRequest, jsonl_requests, noodle_requests
from minilm_engine.bench.metrics import LATENCY_METRICS, parse_metric_names, parse_percentiles, parse_slo
from minilm_engine.bench.serve import (
    ENDPOINTS,
    BenchConfig,
    BenchResult,
    json_rate,
    percentile_word,
    run_benchmark,
    sweep,
)

BACKEND_ENDPOINTS = {"openai": "/v1/completions", "vllm": "/v1/completions", "openai-chat": "/v1/chat/completions"}
DATASETS = ("noodle", "random", "custom")
RANDOM_LENS = (1024, 128)  # vLLM's --random-input-len and --random-output-len defaults
TITLES = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
          "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency")}
WIDTH = 50  # vLLM's report width


# -- the report --------------------------------------------------------------------------------


def format_report(result: BenchResult) -> str:
    """The run as `vllm bench serve` prints it (plus the endpoint)."""
    m, c = result.metrics, result.config

    def row(label: str, value, fmt: str = "") -> str:
        text = "-" if value is None else format(value, fmt)
        return f"{label:<40} {text:<10}".rstrip()

    lines = [f"{' Serving Benchmark Result ':=^{WIDTH}}",
             row("Endpoint:", c.base_url.rstrip("/") + c.endpoint),
             row("Successful requests:", m.num_completed),
             row("Failed requests:", m.num_failed)]
    if c.max_concurrency is not None:
        lines.append(row("Maximum request concurrency:", c.max_concurrency))
    if not math.isinf(c.request_rate):
        lines.append(row("Request rate configured (RPS):", c.request_rate, ".2f"))
    lines += [row("Benchmark duration (s):", m.duration_s, ".2f"),
              row("Total input tokens:", m.total_input_tokens),
              row("Total generated tokens:", m.total_output_tokens),
              row("Request throughput (req/s):", m.request_throughput, ".2f")]
    if m.goodput is not None:
        lines.append(row("Request goodput (req/s):", m.goodput, ".2f"))
    lines += [row("Output token throughput (tok/s):", m.output_throughput, ".2f"),
              row("Peak output token throughput (tok/s):", m.max_output_tokens_per_s, ".2f"),
              row("Peak concurrent requests:", m.max_concurrent_requests, ".2f"),
              row("Total Token throughput (tok/s):", m.total_token_throughput, ".2f")]
    for name in c.percentile_metrics:
        short, title = TITLES[name]
        summary = m.latency(name)
        lines += [f"{title:-^{WIDTH}}",
                  row(f"Mean {short} (ms):", summary.mean, ".2f"),
                  row(f"Median {short} (ms):", summary.median, ".2f")]
        for p in c.metric_percentiles:
            lines.append(row(f"P{percentile_word(p)} {short} (ms):", summary.percentiles.get(float(p)), ".2f"))
    if c.max_retries:
        lines.append(row("Retries (total):", sum(r.num_retries for r in result.results)))
    errors = sorted({r.error for r in result.results if not r.success})
    if errors:
        lines.append(f"first errors: {errors[:3]}")
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def format_sweep(results: list[BenchResult]) -> str:
    header = f"{'rate':>8} {'req/s':>7} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'goodput':>8}"
    rows = [header]
    for r in results:
        m = r.metrics

        def f(v):
            return "-" if v is None else f"{v:.1f}"
        rows.append(f"{str(json_rate(r.config.request_rate)):>8} {m.request_throughput:>7.2f} {m.output_throughput:>8.1f} "
                    f"{f(m.ttft_ms.median):>9} {f(m.ttft_ms.p99):>9} {f(m.itl_ms.median):>8} {f(m.itl_ms.p99):>8} "
                    f"{f(m.goodput) if m.goodput is not None else '-':>8}")
    return "\n".join(rows)


# -- the flags ---------------------------------------------------------------------------------


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
    where = p.add_argument_group("the server")
    where.add_argument("--base-url", default=None, help="the server, without /v1 (default: http://HOST:PORT)")
    where.add_argument("--host", default="127.0.0.1")
    where.add_argument("--port", type=int, default=8000)
    where.add_argument("--model", required=True, help="the model name the server knows (GET /v1/models)")
    where.add_argument("--served-model-name", default=None, help="the name sent in requests, if not --model (vLLM)")
    where.add_argument("--backend", default="openai", choices=sorted(BACKEND_ENDPOINTS),
                       help="openai and vllm: /v1/completions; openai-chat: /v1/chat/completions")
    where.add_argument("--endpoint", default=None, choices=ENDPOINTS, help="default: the backend's")
    where.add_argument("--api-key", default=None)
    where.add_argument("--ready-check-timeout-sec", type=float, default=600.0,
                       help="how long the initial test request may wait for the server; 0 skips the test")
    data = p.add_argument_group("the requests")
    data.add_argument("--dataset-name", default=None, choices=DATASETS,
                      help="noodle: the shop's prompts (default); random: corpus text cut to --random-input-len "
                           "tokens (vLLM's random draws token ids; the shipped models know only the corpus); "
                           "custom: --dataset-path, a JSONL file of {\"prompt\": ...}")
    data.add_argument("--dataset", default=None, help="'noodle' or a JSONL file (this package's spelling)")
    data.add_argument("--dataset-path", default=None, help="the JSONL file of --dataset-name custom")
    data.add_argument("--num-prompts", type=int, default=100)
    data.add_argument("--input-len", "--random-input-len", dest="input_len", type=int, default=None,
                      help="prompt tokens (noodle default: a document's first line; random: 1024, cut to fit "
                           "the served model's max_model_len from /v1/models)")
    data.add_argument("--output-len", "--random-output-len", "--custom-output-len", dest="output_len", type=int,
                      default=None, help="max_tokens of each request (default 32; random: 128, cut to fit the context)")
    data.add_argument("--range-ratio", "--random-range-ratio", dest="range_ratio", type=float, default=0.0,
                      help="lengths uniform in [L(1-r), L(1+r)]")
    data.add_argument("--tokenizer", default=None, help="to cut prompts to --input-len tokens (default: --model if it loads)")
    data.add_argument("--trust-remote-code", action="store_true", help="passed to the tokenizer's loading")
    load = p.add_argument_group("the load")
    load.add_argument("--request-rate", type=_rate, default=math.inf, help="requests/s, Poisson (default inf: all at once)")
    load.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps: <1 burstier, 1 Poisson")
    load.add_argument("--max-concurrency", type=int, default=None)
    load.add_argument("--num-warmups", type=int, default=0, help="requests sent before the timed run (vLLM)")
    load.add_argument("--sweep", default=None, help="comma-separated request rates, e.g. 1,2,4,inf")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--timeout", type=float, default=600.0, help="seconds per request (each try)")
    load.add_argument("--max-retries", type=int, default=0,
                      help="retry a request refused with 429 / 503 (or unanswered) up to N times, waiting "
                           "Retry-After plus exponential backoff with full jitter (default 0: one try, as vLLM)")
    load.add_argument("--retry-base-delay", type=float, default=0.5, help="seconds: the first backoff's cap")
    load.add_argument("--retry-max-delay", type=float, default=30.0, help="seconds: the backoff's largest cap")
    sampling = p.add_argument_group("sampling")
    sampling.add_argument("--temperature", type=float, default=0.0)
    sampling.add_argument("--top-p", type=float, default=None)
    sampling.add_argument("--top-k", type=int, default=None)
    sampling.add_argument("--ignore-eos", action="store_true", help="ask for exactly max_tokens (vLLM extension; "
                                                                    "always on with --dataset-name random, as in vLLM)")
    sampling.add_argument("--no-stream", action="store_true", help="ask for whole answers (TTFT = E2E: what the user waits)")
    sampling.add_argument("--extra-body", type=json_object, default=None, help="JSON merged into every request body")
    out = p.add_argument_group("the result")
    out.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS", help="SLOs, e.g. ttft:500 tpot:50")
    out.add_argument("--percentile-metrics", default=",".join(LATENCY_METRICS),
                     help="latencies to report, of ttft,tpot,itl,e2el (default: all four)")
    out.add_argument("--metric-percentiles", default="90,99", help="percentiles to report, e.g. 50,99,99.9")
    out.add_argument("--result-file", "--result-filename", dest="result_file", default=None,
                     help="write the JSON result here (vLLM's --result-filename; implies --save-result)")
    out.add_argument("--save-result", action="store_true", help="write the JSON result (default name as vLLM's)")
    out.add_argument("--result-dir", default=None, help="folder for the JSON result")
    out.add_argument("--save-detailed", action="store_true", help="accepted for vLLM's sake: per-request lists "
                                                                  "(ttfts, itls, ...) are always written")
    out.add_argument("--label", default=None, help="the result's label (default: the backend)")
    out.add_argument("--metadata", nargs="*", default=None, metavar="KEY=VALUE", help="extra keys for the JSON result")
    out.add_argument("--no-progress", "--disable-tqdm", dest="no_progress", action="store_true")
    p.set_defaults(run=run_bench_serve)
    return p


def _load_tokenizer(name: str | None, trust_remote_code: bool = False):
    if name is None:
        return None
    try:
        from transformers import AutoTokenizer

        from minilm_engine.model import resolve_model_path

        return AutoTokenizer.from_pretrained(str(resolve_model_path(name)), trust_remote_code=trust_remote_code)
    except Exception:
        return None


def dataset_of(args: argparse.Namespace) -> tuple[str, str | None]:
    """(kind, JSONL path) from either spelling: --dataset-name/--dataset-path or --dataset."""
    if args.dataset_name is not None and args.dataset is not None:
        raise ValueError("give --dataset-name (vLLM's spelling) or --dataset, not both")
    if args.dataset_name == "custom":
        if args.dataset_path is None:
            raise ValueError("--dataset-name custom needs --dataset-path FILE.jsonl")
        return "custom", args.dataset_path
    if args.dataset_name is not None:
        return args.dataset_name, None
    if args.dataset is None or args.dataset == "noodle":
        return "noodle", None
    return "custom", args.dataset


def random_lengths(input_len: int | None, output_len: int | None, range_ratio: float,
                   max_model_len: int | None) -> tuple[int, int]:
    """The lengths given, else vLLM's defaults (1024 in, 128 out) cut to fit `max_model_len`
    (the served model's, when known) at the longest draw."""
    want_in, want_out = input_len or RANDOM_LENS[0], output_len or RANDOM_LENS[1]
    if max_model_len is None or (input_len and output_len):
        return want_in, want_out
    room = int(max_model_len / (1 + range_ratio))  # the longest draw of each length still fits
    if output_len is None:
        want_out = max(1, min(want_out, room // 8, room - (input_len or 1)))
    if input_len is None:
        want_in = max(1, min(want_in, room - want_out))
    return want_in, want_out


def served_max_model_len(config: BenchConfig) -> int | None:
    """The served model's context from `GET /v1/models` (vLLM's `max_model_len`), or None."""
    import httpx

    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    try:
        cards = httpx.get(config.base_url.rstrip("/") + "/v1/models", headers=headers, timeout=10).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    lengths = [c.get("max_model_len") for c in cards if isinstance(c, dict) and c.get("id") == config.model]
    return lengths[0] if lengths and isinstance(lengths[0], int) else None


def requests_from_args(args: argparse.Namespace, max_model_len: int | None = None) -> list[BenchRequest]:
    kind, path = dataset_of(args)
    if kind == "custom":
        return jsonl_requests(path, args.num_prompts, args.output_len or 32, args.range_ratio, args.seed)
    input_len, output_len = args.input_len, args.output_len or 32
    if kind == "random":
        input_len, output_len = random_lengths(args.input_len, args.output_len, args.range_ratio, max_model_len)
        if (input_len, output_len) != RANDOM_LENS and not (args.input_len and args.output_len):
            print(f"[random dataset: {input_len} input and {output_len} output tokens, to fit the served "
                  f"model's max_model_len of {max_model_len}]", file=sys.stderr)
    tokenizer = None
    if input_len:
        tokenizer = _load_tokenizer(args.tokenizer or args.model, args.trust_remote_code)
        if tokenizer is None:
            print(f"[no tokenizer for {args.tokenizer or args.model!r}: prompt lengths estimated at "
                  "4 characters a token]", file=sys.stderr)
    return noodle_requests(args.num_prompts, output_len, input_len, args.range_ratio, args.seed, tokenizer)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    extra = {k: v for k, v in (("top_p", args.top_p), ("top_k", args.top_k)) if v is not None}
    return BenchConfig(
        base_url=args.base_url or f"http://{args.host}:{args.port}",
        model=args.served_model_name or args.model,
        endpoint=args.endpoint or BACKEND_ENDPOINTS[args.backend],
        request_rate=args.request_rate, burstiness=args.burstiness, max_concurrency=args.max_concurrency,
        api_key=args.api_key, temperature=args.temperature,
        # As vLLM: a random dataset asks for exactly max_tokens.
        ignore_eos=args.ignore_eos or dataset_of(args)[0] == "random",
        stream=not args.no_stream, slo=parse_slo(args.goodput), timeout_s=args.timeout, seed=args.seed,
        extra_body={**extra, **(args.extra_body or {})}, backend=args.backend, label=args.label,
        percentile_metrics=parse_metric_names(args.percentile_metrics),
        metric_percentiles=parse_percentiles(args.metric_percentiles),
        initial_test=args.ready_check_timeout_sec > 0, ready_timeout_s=args.ready_check_timeout_sec,
        num_warmups=args.num_warmups, max_retries=args.max_retries, retry_base_delay_s=args.retry_base_delay,
        retry_max_delay_s=args.retry_max_delay,
    )


def result_path(args: argparse.Namespace, config: BenchConfig) -> Path | None:
    """--result-file, else with --save-result vLLM's name "{label}-{rate}qps[-concurrency{N}]-
    {model}-{date}.json"; in --result-dir if given."""
    if args.result_file is None and not args.save_result:
        return None
    name = args.result_file
    if name is None:
        concurrency = f"-concurrency{config.max_concurrency}" if config.max_concurrency is not None else ""
        name = (f"{config.label or config.backend}-{args.request_rate}qps{concurrency}-"
                f"{args.model.split('/')[-1]}-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    folder = Path(args.result_dir) if args.result_dir else Path()
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def _metadata(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--metadata takes KEY=VALUE pairs, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def run_bench_serve(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        rates = [_rate(r) for r in args.sweep.split(",")] if args.sweep else None
        metadata = _metadata(args.metadata)
        random_defaults = dataset_of(args)[0] == "random" and not (args.input_len and args.output_len)
        requests = requests_from_args(args, served_max_model_len(config) if random_defaults else None)
    except (ValueError, OSError, argparse.ArgumentTypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if rates is None:
            results = [run_benchmark(config, requests, progress=not args.no_progress)]
            print(format_report(results[0]))
        else:
            results = sweep(config, requests, rates, progress=not args.no_progress)
            for r in results:
                print(format_report(r))
            print(format_sweep(results))
    except ValueError as e:  # the initial test request failed
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = result_path(args, config)
    if path is not None:
        points = [{**r.to_dict(), "tokenizer_id": args.tokenizer or args.model, **metadata} for r in results]
        payload = points[0] if rates is None else {"sweep": points}
        path.write_text(json.dumps(payload, indent=1))
        print(f"[result written to {path}]", file=sys.stderr)
    return 0 if all(r.metrics.num_completed > 0 for r in results) else 1
