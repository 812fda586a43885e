"""`minilm-engine serve [MODEL] [options]`, like `vllm serve`, and `minilm-engine run-batch -i
IN.jsonl -o OUT.jsonl --model MODEL [options]`, like `vllm run-batch`, with vLLM's engine flags.

Contract: `serve` builds the `LLM` (record_trace off: a server runs for hours) and serves until
Ctrl-C; `--rate-limit-rpm` / `--rate-limit-tpm` limit every API key and `--api-keys-file` lists
the keys allowed with their own limits (rate_limit.py).  `run-batch` writes one result line per
request and returns 0 even when some failed (their errors are in the output).  Both return 2
with the reason on arguments they cannot start with.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

import torch

from minilm_engine.bench.cli_types import json_object, json_string_list
from minilm_engine.core.config import EngineConfig
from minilm_engine.model.device import cpu_threads_for
from minilm_engine.entrypoints.llm import LLM
from minilm_engine.entrypoints import DEFAULT_HOST
from minilm_engine.entrypoints.rate_limit import RateLimiter, RateLimits, load_keys_file


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The `EngineConfig` fields, spelled as vLLM's command line spells them."""
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--num-kv-blocks", type=int, default=None)
    parser.add_argument("--kv-cache-memory", type=int, default=None, help="bytes for the KV pool")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--attention-backend", default=None, choices=["auto", "torch", "cpu", "triton"])
    parser.add_argument("--enforce-eager", action="store_true", default=None)
    parser.add_argument("--model-backend", default=None, choices=["fused", "reference"],
                        help="fused (the fast CPU path; the default) or reference")
    parser.add_argument("--speculative-config", type=json_object, default=None,
                        help='speculative decoding, as vLLM spells it: \'{"model": "noodle-apprentice", '
                             '"num_speculative_tokens": 3}\'')
    parser.add_argument("--structured-outputs-config", type=json_object, default=None,
                        help='e.g. \'{"disable_any_whitespace": true}\' (compact JSON)')
    parser.add_argument("--scheduling-policy", default=None, choices=["fcfs", "priority"],
                        help="fcfs (arrival order, the default) or priority (lower first)")
    parser.add_argument("--max-logprobs", type=int, default=None, help="most top logprobs per token (default 20)")
    parser.add_argument("--max-n", type=int, default=None, help="most samples per prompt, n (default 128)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads on a CPU (default: 1 for a small model, torch's choice otherwise)")


def llm_from_args(args: argparse.Namespace) -> LLM:
    """The `LLM` of `add_engine_arguments`' flags (an `EngineConfig` field's flag: its value)."""
    engine_args = {f.name: getattr(args, f.name) for f in fields(EngineConfig)
                   if getattr(args, f.name, None) is not None}
    check_threads(args.threads)
    llm = LLM(args.model, device=args.device, dtype=args.dtype, seed=args.seed,
              max_model_len=args.max_model_len, model_backend=getattr(args, "model_backend", None),
              **{**engine_args, "record_trace": False})
    set_cpu_threads(llm, args.threads)
    return llm


def check_threads(threads: int | None) -> None:
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")


def set_cpu_threads(llm: LLM, threads: int | None) -> None:
    """On a CPU: `threads` torch threads (None: 1 for a small model, torch's choice otherwise)."""
    if llm.device.type == "cpu":
        threads = threads or cpu_threads_for(llm.num_parameters)
        if threads is not None:
            torch.set_num_threads(threads)


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("serve", help="serve MODEL over an OpenAI-compatible HTTP API")
    parser.add_argument("model", nargs="?", default=None,
                        help="folder, shipped name or hub id (default: noodle-chef)")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+", action="extend", default=None, metavar="NAME",
                        help="name(s) clients use in 'model', as vLLM takes them: --served-model-name a b "
                             "(default: MODEL as given, e.g. Qwen/Qwen3-0.6B)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    limits = parser.add_argument_group("rate limits (per API key, 429 with Retry-After over them)")
    limits.add_argument("--rate-limit-rpm", type=int, default=None, metavar="N",
                        help="requests per minute for every key (default: unlimited)")
    limits.add_argument("--rate-limit-tpm", type=int, default=None, metavar="N",
                        help="tokens per minute for every key: prompt + max_tokens reserved at admission, "
                             "settled to the real count at completion (default: unlimited)")
    limits.add_argument("--api-keys-file", default=None, metavar="KEYS.json",
                        help='the keys allowed and their limits: {"KEY": {"requests_per_minute": 60, '
                             '"tokens_per_minute": 10000}}; a field left out takes --rate-limit-*; '
                             "any other key is a 401")
    limits.add_argument("--rate-limit-period", type=float, default=60.0, metavar="SECONDS",
                        help="the time the limits count over (default 60; a demo shortens it)")
    cors = parser.add_argument_group("CORS (browsers calling the API from other origins), as vLLM spells it")
    cors.add_argument("--allowed-origins", type=json_string_list, default=["*"], metavar="JSON",
                      help='origins allowed, a JSON list (default ["*"])')
    cors.add_argument("--allowed-methods", type=json_string_list, default=["*"], metavar="JSON",
                      help='HTTP methods allowed, a JSON list (default ["*"])')
    cors.add_argument("--allowed-headers", type=json_string_list, default=["*"], metavar="JSON",
                      help='request headers allowed, a JSON list (default ["*"])')
    cors.add_argument("--allow-credentials", action="store_true", help="allow cookies and credentials")
    parser.add_argument("--shutdown-timeout", type=float, default=5.0,
                        help="seconds in-flight requests get to finish on Ctrl-C before they are aborted")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_engine_arguments(parser)
    parser.set_defaults(run=run_serve)
    return parser


def rate_limiter_from_args(args: argparse.Namespace) -> RateLimiter | None:
    """The limiter the flags ask for (None: no limit, no keys file); raises ValueError."""
    for flag, value in (("--rate-limit-rpm", args.rate_limit_rpm), ("--rate-limit-tpm", args.rate_limit_tpm)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if not args.rate_limit_period > 0:
        raise ValueError(f"--rate-limit-period must be > 0 seconds, got {args.rate_limit_period}")
    defaults = RateLimits(args.rate_limit_rpm, args.rate_limit_tpm)
    if args.api_keys_file is not None:
        if args.api_key is not None:
            raise ValueError("give --api-key or --api-keys-file, not both")
        return RateLimiter(defaults, load_keys_file(args.api_keys_file, defaults), period_s=args.rate_limit_period)
    return None if defaults.is_unlimited else RateLimiter(defaults, period_s=args.rate_limit_period)


def run_serve(args: argparse.Namespace) -> int:
    try:
        if not 0 < args.port < 65536:
            raise ValueError(f"--port must be in 1..65535, got {args.port}")
        limiter = rate_limiter_from_args(args)  # before the model loads: a bad keys file fails fast
        llm = llm_from_args(args)
    except (ValueError, TypeError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[{llm}, torch threads: {torch.get_num_threads()}]", file=sys.stderr)
    engine = llm.engine
    print(engine.kv_budget.describe((1, engine.config.max_num_seqs)), file=sys.stderr)
    print(f"  max_model_len: {llm.max_model_len:,}"
          f" ({llm.input_processor.max_model_len_reason or 'the architecture'})", file=sys.stderr)
    from minilm_engine.entrypoints.openai.api_server import CORSOptions, serve  # FastAPI and uvicorn: the "serve" extra

    print(f"[serving on http://{args.host}:{args.port}/v1, Ctrl-C to stop]", file=sys.stderr)
    cors = CORSOptions(args.allowed_origins, args.allowed_methods, args.allowed_headers, args.allow_credentials)
    serve(llm, args.host, args.port, args.served_model_name, args.api_key, args.shutdown_timeout, args.log_level,
          limiter, cors)
    return 0


def add_run_batch_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("run-batch", help="run an OpenAI batch file (JSONL) through MODEL")
    parser.add_argument("-i", "--input-file", required=True,
                        help='one request a line: {"custom_id", "method": "POST", "url", "body"}')
    parser.add_argument("-o", "--output-file", required=True, help="results, one JSON line per request")
    parser.add_argument("--model", default=None, help="folder, shipped name or hub id (default: noodle-chef)")
    parser.add_argument("--served-model-name", nargs="+", action="extend", default=None, metavar="NAME",
                        help="name(s) the bodies' 'model' may use (default: MODEL as given)")
    parser.add_argument("--disable-progress-bar", action="store_true", help="no progress bar on stderr")
    add_engine_arguments(parser)
    parser.set_defaults(run=run_run_batch)
    return parser


def run_run_batch(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from minilm_engine.entrypoints.openai.run_batch import run_batch

    try:
        lines = Path(args.input_file).read_text(encoding="utf-8").splitlines()
        out = open(args.output_file, "w", encoding="utf-8")  # fails now, not after the whole run
    except (OSError, UnicodeDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with out:
        try:
            llm = llm_from_args(args)
        except (ValueError, TypeError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"[{llm}, torch threads: {torch.get_num_threads()}]", file=sys.stderr)
        results = run_batch(llm, lines, args.served_model_name, progress=not args.disable_progress_bar)
        for result in results:
            out.write(json.dumps(result) + "\n")
    failed = sum(r["error"] is not None for r in results)
    print(f"[{len(results)} requests: {len(results) - failed} succeeded, {failed} failed -> "
          f"{args.output_file}]", file=sys.stderr)
    return 0
