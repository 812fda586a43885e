"""`minilm-engine serve [MODEL] --host 127.0.0.1 --port 8000 [engine options]`, like `vllm serve`.

Contract: `add_serve_parser(subparsers)` registers the subcommand (engine options use vLLM's
flag names); its `run` builds the `LLM` (record_trace off: a server runs for hours) and serves
until Ctrl-C, returning 2 with the reason on bad arguments.
"""

from __future__ import annotations

import argparse
import sys

import torch

from ..cli_types import json_object
from ..device import cpu_threads_for
from ..llm import LLM
from . import DEFAULT_HOST


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
    parser.add_argument("--attention-backend", default=None, choices=["auto", "torch", "triton"])
    parser.add_argument("--enforce-eager", action="store_true", default=None)
    parser.add_argument("--speculative-config", type=json_object, default=None,
                        help='speculative decoding, as vLLM spells it: \'{"model": "noodle-apprentice", '
                             '"num_speculative_tokens": 3}\'')
    parser.add_argument("--max-logprobs", type=int, default=None, help="most top logprobs per token (default 20)")
    parser.add_argument("--max-n", type=int, default=None, help="most samples per prompt, n (default 128)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads on a CPU (default: 1 for a small model, torch's choice otherwise)")


ENGINE_FIELDS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks", "kv_cache_memory",
                 "gpu_memory_utilization", "enable_prefix_caching", "enable_chunked_prefill",
                 "attention_backend", "enforce_eager", "speculative_config", "max_logprobs", "max_n")


def llm_from_args(args: argparse.Namespace) -> LLM:
    engine_args = {name: getattr(args, name) for name in ENGINE_FIELDS if getattr(args, name) is not None}
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    llm = LLM(args.model, device=args.device, dtype=args.dtype, seed=args.seed,
              max_model_len=args.max_model_len, record_trace=False, **engine_args)
    if llm.device.type == "cpu":
        threads = args.threads or cpu_threads_for(llm.num_parameters)
        if threads is not None:
            torch.set_num_threads(threads)
    return llm


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
    parser.add_argument("--shutdown-timeout", type=float, default=5.0,
                        help="seconds in-flight requests get to finish on Ctrl-C before they are aborted")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_engine_arguments(parser)
    parser.set_defaults(run=run_serve)
    return parser


def run_serve(args: argparse.Namespace) -> int:
    try:
        if not 0 < args.port < 65536:
            raise ValueError(f"--port must be in 1..65535, got {args.port}")
        llm = llm_from_args(args)
    except (ValueError, TypeError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[{llm}, torch threads: {torch.get_num_threads()}]", file=sys.stderr)
    from .openai.api_server import serve  # FastAPI and uvicorn: the "serve" extra

    print(f"[serving on http://{args.host}:{args.port}/v1, Ctrl-C to stop]", file=sys.stderr)
    serve(llm, args.host, args.port, args.served_model_name, args.api_key, args.shutdown_timeout, args.log_level)
    return 0
