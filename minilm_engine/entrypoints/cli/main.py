"""`minilm-engine generate "prompt"`: stream a completion to the terminal and report tokens/s.

`minilm-engine quantize MODEL OUT --quantization int4`: write a quantized checkpoint.
Also `minilm-engine serve` and `run-batch` (entrypoints/cli/serve.py) and `minilm-engine bench serve`
(bench/cli.py).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.entrypoints.cli.serve import check_threads, set_cpu_threads
from minilm_engine.entrypoints.llm import LLM


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minilm-engine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="stream a completion of PROMPT")
    gen.add_argument("prompt")
    gen.add_argument("--model", default=None, help="folder, shipped name or hub id (default: noodle-chef)")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    gen.add_argument("--device", default=None)
    gen.add_argument("--dtype", default="auto")
    gen.add_argument("--threads", type=int, default=None,
                     help="torch threads on a CPU (default: 1 for a small model, torch's choice otherwise)")
    gen.add_argument("--speculative-model", default=None,
                     help="draft model for speculative decoding: folder, hub id or noodle-apprentice")
    gen.add_argument("--num-speculative-tokens", type=int, default=None,
                     help="tokens the draft proposes per step (with --speculative-model; 0 = off)")
    add_quantize_parser(sub)
    # Serving: each subcommand sets `run`, which main() calls.
    from minilm_engine.bench.cli import add_bench_parser
    from minilm_engine.entrypoints.cli.serve import add_run_batch_parser, add_serve_parser

    add_serve_parser(sub)
    add_run_batch_parser(sub)
    add_bench_parser(sub)
    return parser


def speculative_config(args: argparse.Namespace) -> dict | None:
    """--speculative-model and --num-speculative-tokens -> LLM's speculative_config (or None)."""
    if args.speculative_model is None:
        if args.num_speculative_tokens:
            raise ValueError("--num-speculative-tokens needs --speculative-model (the draft model)")
        return None
    if args.num_speculative_tokens is None:
        raise ValueError("--speculative-model needs --num-speculative-tokens K (tokens drafted per step, e.g. 3)")
    return {"model": args.speculative_model, "num_speculative_tokens": args.num_speculative_tokens}


def add_quantize_parser(sub) -> None:
    from minilm_engine.model.quantization.config import GROUP_SIZES, METHODS, SCHEMES

    quant = sub.add_parser("quantize", help="write a weight-only quantized copy of MODEL to OUT")
    quant.add_argument("model", help="folder or shipped name (noodle-chef, noodle-apprentice)")
    quant.add_argument("out", help="folder to write (safetensors + config.json with quantization_config)")
    quant.add_argument("--quantization", required=True, choices=SCHEMES)
    quant.add_argument("--group-size", type=int, default=None, help=f"int4 only: one of {GROUP_SIZES} (default 128)")
    quant.add_argument("--method", default="rtn", choices=METHODS, help="rtn, or awq (calibrated)")
    quant.add_argument("--calibration-file", action="append", default=None,
                       help="a text file to calibrate on (repeatable; default: held-out noodle-shop text)")
    quant.add_argument("--no-pad", action="store_true",
                       help="int4: refuse layers whose in_features the group size does not divide")
    quant.add_argument("--quantize-lm-head", action="store_true",
                       help="quantize the LM head too (round to nearest); a tied embedding stays full precision")


def quantize_main(args) -> int:
    from pathlib import Path

    from minilm_engine.entrypoints.cli.quantize import quantize_checkpoint

    options = {"method": args.method, "pad_in_features": not args.no_pad, "lm_head": args.quantize_lm_head}
    if args.group_size is not None:
        options["group_size"] = args.group_size
    elif args.quantization == "int4":
        options["group_size"] = 128
    try:
        if args.calibration_file:
            options["calibration_texts"] = [Path(f).read_text() for f in args.calibration_file]
        out = quantize_checkpoint(args.model, args.out, args.quantization, options)
    except (ValueError, TypeError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    llm_bytes = sum(f.stat().st_size for f in Path(out).glob("*.safetensors"))
    print(f"wrote {out} ({llm_bytes:,} bytes of safetensors); load it with LLM({str(out)!r})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "quantize":
        return quantize_main(args)
    if getattr(args, "run", None) is not None:  # serve, bench serve
        return args.run(args)
    try:
        params = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_tokens=args.max_tokens,
            seed=args.seed,
            stop=args.stop,
        )
        check_threads(args.threads)
        spec = speculative_config(args)
        llm = LLM(args.model, device=args.device, dtype=args.dtype, speculative_config=spec)
    except (ValueError, TypeError, RuntimeError, OSError) as e:  # OSError: a bad checkpoint path
        print(f"error: {e}", file=sys.stderr)
        return 2
    set_cpu_threads(llm, args.threads)
    print(f"[{llm}, torch threads: {torch.get_num_threads()}]", file=sys.stderr)
    sys.stdout.write(args.prompt)
    start = time.perf_counter()
    (request,) = llm.make_requests(args.prompt, params)
    for piece in llm.stream_request(request):
        sys.stdout.write(piece)
        sys.stdout.flush()
    elapsed = time.perf_counter() - start
    num_tokens = len(request.output_token_ids)
    print(
        f"\n[{num_tokens} tokens in {elapsed:.2f} s: {num_tokens / elapsed:.1f} tokens/s, "
        f"finish_reason={request.finish_reason}]",
        file=sys.stderr,
    )
    stats = request.metrics.spec_decoding
    if stats is not None and stats.num_drafts:
        print(
            f"[speculative decoding: {stats.num_accepted_tokens} of {stats.num_draft_tokens} drafted "
            f"tokens accepted, {stats.mean_acceptance_length:.2f} tokens per target forward]",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
