"""Disaggregated prefill vs one engine: decode latency while long prompts arrive among streams.

Three configurations on the same workload (the same prompts, seeds and arrival times):
(a) one engine with mixed batches, no chunked prefill (a long prompt runs in one step); (b) one
engine with chunked prefill (a small max_num_batched_tokens); (c) a prefill engine and a decode
engine with the prompt's KV copied between their pools (`minilm_engine/distributed/kv_transfer`).
They alternate in every repeat; each cell is the median [min-max] over the repeats.  The
measuring code is the package's (`minilm_engine.course.experiments.disaggregation`), which chapter 10
runs.

How (c) is timed on one machine: its two engines share these cores and run in one thread, so
each engine gets its own clock that advances by its own measured steps (and, for the decode
engine, by the KV copies it pulls): what two separate devices running at these speeds would
show.  (a) and (b) are timed the same way, on one clock.  With one torch thread (the default)
a step is timed in CPU seconds of this process, which other programs on a busy machine do not
inflate (`course/experiments/disaggregation.py`).

    python benchmarks/disaggregation.py                   # noodle-chef, CPU (~2 min)
    python benchmarks/disaggregation.py --repeats 7 --long-tokens 900
    python benchmarks/disaggregation.py --quick           # tiny sizes (a smoke test)
"""

from __future__ import annotations

import argparse
import json

import torch

from common import add_threads_option, apply_threads_option

from minilm_engine.course.experiments.disaggregation import (
    CONFIGS,
    DisaggWorkload,
    build_configs,
    compare_disaggregation,
    summarize,
)

ROWS = [  # (metric, label, format)
    ("itl_p50_ms", "decode ITL P50 (ms)", "{:.1f}"),
    ("itl_p99_ms", "decode ITL P99 (ms)", "{:.1f}"),
    ("itl_max_ms", "decode ITL max (ms)", "{:.1f}"),
    ("ttft_long_ms", "TTFT, long prompts (ms)", "{:.0f}"),
    ("ttft_p99_ms", "TTFT P99, all (ms)", "{:.0f}"),
    ("makespan_s", "makespan (s)", "{:.2f}"),
    ("device_s", "device-seconds busy", "{:.2f}"),
    ("kv_mib", "KV sent (MiB)", "{:.2f}"),
    ("kv_transfer_ms", "KV copy time (ms)", "{:.1f}"),
]
LABELS = {
    "mixed": "(a) mixed",
    "chunked": "(b) chunked",
    "disagg": "(c) disaggregated",
}


def cell(row, metric: str, fmt: str) -> str:
    values = [row[metric], row[f"{metric}_min"], row[f"{metric}_max"]]
    median, low, high = (fmt.format(v) for v in values)
    return f"{median} [{low}-{high}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="noodle-chef")
    parser.add_argument("--device", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--streams", type=int, default=8, help="requests decoding from the start")
    parser.add_argument("--stream-tokens", type=int, default=96, help="tokens each stream generates")
    parser.add_argument("--long-prompts", type=int, default=3, help="long prompts arriving among the streams")
    parser.add_argument("--long-tokens", type=int, default=768, help="tokens of each long prompt")
    parser.add_argument("--chunk", type=int, default=64, help="(b)'s max_num_batched_tokens")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the script")
    parser.add_argument("--json", default=None, help="also write the summary and every run here")
    add_threads_option(parser)
    args = parser.parse_args()
    apply_threads_option(args)
    if args.quick:
        args.model, args.repeats, args.streams, args.stream_tokens = "noodle-apprentice", 2, 3, 12
        args.long_prompts, args.long_tokens, args.chunk = 2, 96, 16

    workload = DisaggWorkload(
        num_streams=args.streams, stream_max_tokens=args.stream_tokens,
        num_long_prompts=args.long_prompts, long_prompt_tokens=args.long_tokens,
    )
    configs = build_configs(args.model, args.device, args.chunk, args.streams + args.long_prompts)
    mixed = configs["mixed"]
    table, workload = compare_disaggregation(workload=workload, num_repeats=args.repeats, configs=configs)
    summary = summarize(table)

    kv_per_token = mixed.config.kv_bytes_per_token(torch.empty((), dtype=mixed.dtype).element_size())
    print(f"model: {mixed.model_path.name}, {mixed.num_parameters / 1e6:.1f}M parameters, {mixed.device}, "
          f"{mixed.dtype}, torch threads: {torch.get_num_threads()}; KV {kv_per_token} bytes/token")
    print(f"workload: {workload.num_streams} streams x {workload.stream_max_tokens} tokens from t=0; "
          f"{workload.num_long_prompts} prompts of {workload.long_prompt_tokens} tokens "
          f"({workload.long_max_tokens} out) at t = "
          + ", ".join(f"{t:.2f}" for t in workload.long_arrivals_s) + " s; sampled, seeded, EOS ignored")
    print(f"(a) no chunked prefill; (b) max_num_batched_tokens={args.chunk}; (c) prefill engine "
          f"(whole prompts) + decode engine, KV copied between the pools")
    clock = "CPU seconds of this process" if mixed.device.type == "cpu" and torch.get_num_threads() == 1 else "wall seconds"
    print("(c)'s engines share this CPU: each is timed on its own clock of its own steps "
          f"(what separate devices would give), in {clock}")
    print(f"median [min-max] over {args.repeats} alternating repeats\n")
    width = 26
    print(f"{'':<{width}}" + "".join(f"{LABELS[c]:>26}" for c in CONFIGS))
    rows = {r["config"]: r for _, r in summary.iterrows()}
    for metric, label, fmt in ROWS:
        print(f"{label:<{width}}" + "".join(f"{cell(rows[c], metric, fmt):>26}" for c in CONFIGS))
    disagg = rows["disagg"]
    sent, cached = disagg["kv_tokens"], disagg["kv_cached_tokens"]
    print(f"\nKV hand-over per run: {sent:.0f} prompt tokens sent ({kv_per_token * sent / 2**20:.2f} MiB), "
          f"{cached:.0f} found in the decode engine's prefix cache (not sent)")
    if disagg["kv_transfer_ms"] > 0:
        rate = kv_per_token * sent / (disagg["kv_transfer_ms"] / 1e3) / 1e9
        print(f"in-process copy: {rate:.2f} GB/s; over a 25 GB/s link the same bytes would take "
              f"{1e3 * kv_per_token * sent / 25e9:.2f} ms")
    same = bool(summary["same_tokens"].all())
    print(f"same tokens in every configuration and repeat: {same}")
    ratio = rows["mixed"]["itl_p99_ms"] / disagg["itl_p99_ms"]
    print(f"decode ITL P99: (a) / (c) = {ratio:.1f}x, (b) / (c) = "
          f"{rows['chunked']['itl_p99_ms'] / disagg['itl_p99_ms']:.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary.to_dict(orient="records"), "runs": table.to_dict(orient="records"),
                       "long_arrivals_s": list(workload.long_arrivals_s), "same_tokens": same}, f, indent=1)


if __name__ == "__main__":
    main()
