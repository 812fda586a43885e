"""Weight-only quantization, measured: bytes, and batch-1 (and batch-16) decode speed.

A Qwen3-0.6B configuration (shapes from `course/known_configs.py`) with random weights, written
by this script as a bf16 checkpoint, then quantized with `minilm-engine quantize`'s own function
(round to nearest; calibration changes quality, not bytes or speed):

    1. bytes of the quantized projection layers (codes + scales + offsets, as stored) vs the
       same layers in fp16/bf16 (goals: int8 <= 0.52x, int4 g128 <= 0.30x), and the whole
       checkpoint (embeddings, norms and the unquantized LM head included) beside it, and the
       bytes one decode step reads (every weight but the embedding table, of which a lookup
       reads one row; a tied, unquantized head reads the table itself)
    2. batch-1 decode tokens/s on the CPU, int8 and int4 vs fp32 (goal: int8 >= 1.5x), each with
       fp32 and with bf16 activations (torch's operators are vectorized for bf16): decode at
       batch 1 reads every weight once per token, so fewer bytes should mean more tokens; and
       with the LM head quantized too (bf16 activations)
    3. the decode step at batch 1, 4 and 16 and a 512-token prefill on the CPU, int8 and int4
       g128 vs bf16 and vs fp32, each with bf16 and with fp32 activations (goals: >= 1.0x of
       bf16 at every batch size, prefill no slower than 1.2x bf16; fp32 beside it because a CPU
       without native bf16 matmul runs fp32 faster): the six engines stay loaded, and every
       repeat runs them one after another in a rotating order; a cell is the median of its
       repeats, with their spread, and a ratio the median of the per-repeat ratios
    4. on a GPU (when there is one): int8 and int4 vs bf16 at batch 1 and 16 (goal: int4 >=
       1.8x at batch 1), with the Triton kernels

Each configuration runs in this one process, warmed up first, with the fp32 model kept in memory
beside it: every decode run of a setting is paired with an fp32 run just before it, and a row's
ratio is the median of its pairs' (`--repeats`, default 3), so a machine whose load changes
during the script moves both sides of a ratio. The CPU part uses every core by default.

    python benchmarks/quantization.py                 # full size: a few minutes on a CPU
    python benchmarks/quantization.py --quick         # a tiny config: seconds (the smoke test)
    python benchmarks/quantization.py --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import QUICK_OVERRIDES, QWEN3_0_6B, add_threads_option, apply_threads_option, sync

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.experiments.quantization import Setting, decode_speed_table, write_random_qwen3
from minilm_engine.course.known_configs import KNOWN_CONFIGS
from minilm_engine.entrypoints.cli.quantize import quantize_checkpoint

MODEL_ID = QWEN3_0_6B
SCHEMES = {"int8": ("int8", {}), "int4 g128": ("int4", {"group_size": 128})}
# The LM head quantized too (quantization_config={"lm_head": True}); the tied embedding keeps
# its table, so the checkpoint grows while what a decode step reads shrinks.
HEAD_SCHEMES = {f"{label} + head": (scheme, {**options, "lm_head": True}) for label, (scheme, options) in SCHEMES.items()}
QUANTIZED_NAMES = (".qweight", ".scales", ".offsets", ".input_scales")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny config (CI smoke test)")
    parser.add_argument("--tokens", type=int, default=None, help="decode tokens timed per run")
    parser.add_argument("--num-layers", type=int, default=None, help="fewer layers than the real model (faster)")
    parser.add_argument("--skip-cpu-speed", action="store_true")
    parser.add_argument("--skip-batch-table", action="store_true", help="leave out part 3")
    parser.add_argument("--batch-sizes", default="1,4,16", help="part 3's decode batch sizes")
    parser.add_argument("--prefill-tokens", type=int, default=None, help="part 3's prompt length (default 512)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--repeats", type=int, default=3,
                        help="decode runs per setting, each paired with an fp32 run (medians are reported)")
    # Decode of a 0.6B model reads ~1-2 GB per token: one core cannot keep the memory busy
    # (torch's int8 operator ran at ~8 GB/s on one AVX2 core, ~14 GB/s on two).
    add_threads_option(parser, default=os.cpu_count() or 1,
                       why="every core: one core cannot keep the memory busy for a model this size")
    return parser.parse_args(argv)


def write_random_checkpoint(folder: Path, quick: bool, num_layers: int | None) -> None:
    fields = {k: v for k, v in KNOWN_CONFIGS[MODEL_ID].items() if k not in ("architectures", "torch_dtype")}
    if quick:
        fields.update(QUICK_OVERRIDES)
    if num_layers:
        fields["num_hidden_layers"] = num_layers
    write_random_qwen3(folder, **fields)
    gc.collect()


def tensor_bytes(folder: Path) -> dict[str, int]:
    from safetensors import safe_open

    sizes = {}
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                t = f.get_slice(name)
                numel = 1
                for d in t.get_shape():
                    numel *= d
                sizes[name] = numel * {"BF16": 2, "F16": 2, "F32": 4, "I8": 1, "U8": 1}[t.get_dtype()]
    return sizes


def projection_bytes(sizes: dict[str, int], quantized: bool) -> int:
    if quantized:
        return sum(v for k, v in sizes.items() if "_proj" in k and k.endswith(QUANTIZED_NAMES))
    return sum(v for k, v in sizes.items() if "_proj.weight" in k)


def bytes_read_per_token(sizes: dict[str, int], tied: bool) -> int:
    """What one batch-1 decode step reads: every tensor but the embedding table (the lookup reads
    one row), unless the head is that table (tied and not quantized)."""
    head_is_table = tied and not any(k.startswith("lm_head.") for k in sizes)
    return sum(v for k, v in sizes.items() if head_is_table or k != "model.embed_tokens.weight")


def batch_tokens_per_s(llm: LLM, batch_size: int, num_tokens: int, device) -> float:
    """Output tokens/s of `batch_size` greedy requests decoding together (short prompts)."""
    params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
    prompts = [f"Order for table {i}:" for i in range(batch_size)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    sync(device)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    sync(device)
    return batch_size * num_tokens / (time.perf_counter() - start)


def decode_step_ms(llm: LLM, batch_size: int, num_tokens: int) -> float:
    """The median over the batch's requests of their mean gap between tokens (they decode
    together, so a gap is one step)."""
    params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
    prompts = [f"Order for table {i}:" for i in range(batch_size)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    return statistics.median(o.metrics.tpot for o in outs) * 1e3


def prefill_ms(llm: LLM, prefill_tokens: int) -> float:
    """One request's time to first token for a `prefill_tokens` prompt."""
    ids = [(i * 7919) % 1000 + 10 for i in range(prefill_tokens)]  # any valid ids: no prefix-cache hits
    (out,) = llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    return out.metrics.ttft * 1e3


def batch_settings() -> dict[str, tuple[str, str]]:
    """Part 3's engines: {label: (checkpoint folder key, dtype)}: bf16 and fp32 unquantized, and
    each scheme with bf16 and with fp32 activations (on a CPU without native bf16 matmul fp32 is
    the faster unquantized baseline, so quantization is judged against both)."""
    settings = {"bf16": ("bf16", "bfloat16"), "fp32": ("bf16", "float32")}
    settings.update({label: (label, "bfloat16") for label in SCHEMES})
    settings.update({f"{label}, fp32": (label, "float32") for label in SCHEMES})
    return settings


def batch_table(folders: dict[str, Path], batch_sizes: list[int], num_tokens: int, prefill_tokens: int,
                repeats: int) -> dict:
    """Part 3: {setting: {"step_ms": {B: [runs]}, "prefill_ms": [runs]}} for `batch_settings()`."""
    settings = batch_settings()
    order = list(settings)
    engines = {}
    for label, (folder, dtype) in settings.items():
        engines[label] = LLM(folders[folder], dtype=dtype, max_num_seqs=max(batch_sizes), record_trace=False,
                             enable_prefix_caching=False, kv_cache_memory=512 << 20)
        decode_step_ms(engines[label], max(batch_sizes), 3)  # warm-up
        prefill_ms(engines[label], 16)
    runs = {label: {"step_ms": {b: [] for b in batch_sizes}, "prefill_ms": []} for label in order}
    for r in range(repeats):
        rotated = order[r % len(order):] + order[: r % len(order)]  # rotate who goes first
        for b in batch_sizes:
            for label in rotated:
                runs[label]["step_ms"][b].append(decode_step_ms(engines[label], b, num_tokens))
        for label in rotated:
            runs[label]["prefill_ms"].append(prefill_ms(engines[label], prefill_tokens))
    return runs


def show_batch_table(runs: dict, batch_sizes: list[int], prefill_tokens: int) -> dict:
    """Print part 3 and return its summary: medians, spreads (min-max) and ratios vs bf16 and
    vs fp32 (each the median of the per-repeat ratios; > 1: faster)."""
    def ratio(values, base):
        return statistics.median(b / v for b, v in zip(base, values))

    def cell(values, bf16, fp32):
        vs_bf16, vs_fp32 = ratio(values, bf16), ratio(values, fp32)
        return (f"{statistics.median(values):7.1f} [{min(values):.1f}-{max(values):.1f}] {vs_bf16:4.2f}x {vs_fp32:4.2f}x",
                {"median_ms": statistics.median(values), "min_ms": min(values), "max_ms": max(values),
                 "speedup_vs_bf16": vs_bf16, "speedup_vs_fp32": vs_fp32})

    columns = [f"decode batch {b}" for b in batch_sizes] + [f"prefill {prefill_tokens} tok"]
    print("   each cell: median ms [min-max], speed vs bf16, speed vs fp32")
    print("   " + f"{'':16}" + "".join(f"{c:>36}" for c in columns))
    summary = {}
    for label, r in runs.items():
        bf16, fp32 = runs["bf16"], runs["fp32"]
        cells = [cell(r["step_ms"][b], bf16["step_ms"][b], fp32["step_ms"][b]) for b in batch_sizes]
        cells.append(cell(r["prefill_ms"], bf16["prefill_ms"], fp32["prefill_ms"]))
        print(f"   {label:16}" + "".join(f"{text:>36}" for text, _ in cells), flush=True)
        summary[label] = dict(zip(columns, (data for _, data in cells)))
    return summary


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_threads_option(args)
    num_tokens = args.tokens or (8 if args.quick else 24)
    results: dict = {"model": f"{MODEL_ID} shape{' (tiny, --quick)' if args.quick else ''}, random weights",
                     "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                            f"{torch.get_num_threads()} torch threads",
                     "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        folders = {"bf16": Path(tmp) / "bf16"}
        t0 = time.perf_counter()
        write_random_checkpoint(folders["bf16"], args.quick, args.num_layers)
        for label, (scheme, options) in {**SCHEMES, **HEAD_SCHEMES}.items():
            folders[label] = quantize_checkpoint(folders["bf16"], Path(tmp) / label.replace(" ", "-"), scheme, options)
        print(f"checkpoints written and quantized in {time.perf_counter() - t0:.1f} s", flush=True)

        # 1. bytes, as stored (scales in bf16, like the weights they stand for)
        tied = json.loads((folders["bf16"] / "config.json").read_text()).get("tie_word_embeddings", False)
        full = tensor_bytes(folders["bf16"])
        base_layers, base_total = projection_bytes(full, False), sum(full.values())
        base_read = bytes_read_per_token(full, tied)
        print(f"\n1. bytes ({results['model']})")
        print(f"   {'':16} {'projection layers':>24} {'whole checkpoint':>24} {'read per decode step':>24}")
        print(f"   {'bf16':16} {base_layers:>16,} 1.000x {base_total:>16,} 1.000x {base_read:>16,} 1.000x")
        results["bytes"] = {"bf16": {"layers": base_layers, "total": base_total, "read_per_step": base_read}}
        for label in (*SCHEMES, *HEAD_SCHEMES):
            sizes = tensor_bytes(folders[label])
            layers, total, read = projection_bytes(sizes, True), sum(sizes.values()), bytes_read_per_token(sizes, tied)
            results["bytes"][label] = {"layers": layers, "total": total, "read_per_step": read,
                                       "layers_ratio": layers / base_layers, "total_ratio": total / base_total,
                                       "read_ratio": read / base_read}
            print(f"   {label:16} {layers:>16,} {layers / base_layers:.3f}x {total:>16,} {total / base_total:.3f}x "
                  f"{read:>16,} {read / base_read:.3f}x")

        # 2. CPU decode at batch 1
        if not args.skip_cpu_speed:
            print(f"\n2. batch-1 decode on the CPU ({results['cpu']}), {num_tokens} tokens, vs fp32 "
                  f"(median of {args.repeats} runs, each beside an fp32 run)")
            # torch's CPU operators are vectorized for bf16 activations (on an AVX2 CPU the fp32
            # path was 5-15x slower per call): the quantized models run both ways.
            settings = [Setting("fp32"), Setting("bf16", dtype="bfloat16")]
            for label, (scheme, options) in SCHEMES.items():
                settings += [Setting(f"{label}, fp32", scheme, options), Setting(f"{label}, bf16", scheme, options, "bfloat16")]
            # fp32 activations are slow on these operators (above): the head rows use bf16 only
            settings += [Setting(f"{label}, bf16", scheme, options, "bfloat16") for label, (scheme, options) in HEAD_SCHEMES.items()]

            speedups = {}
            print(f"   {'':36} {'':>14} {'vs fp32':>7} {'vs bf16':>7}")

            def show(row):
                name = row["setting"] + ("" if row["kernel"] == "-" else f" ({row['kernel']} kernel)")
                runs = "/".join(f"{r:.2f}" for r in row["runs"])
                # bf16 alone halves what fp32 reads: this column is what quantization adds to it
                speedups[row["setting"]] = row["speedup"]
                bf16_ratio = f"{row['speedup'] / speedups['bf16']:5.2f}x" if "bf16" in speedups else "     -"
                print(f"   {name:36} {row['tokens_per_s']:8.2f} tok/s  {row['speedup']:5.2f}x {bf16_ratio}   "
                      f"weights {row['weight_bytes'] / 1e6:,.0f} MB   runs {runs}", flush=True)

            # quantized on load (round to nearest: the same codes as the checkpoints above)
            rows = decode_speed_table(folders["bf16"], settings, num_tokens, progress=show, repeats=args.repeats)
            results["cpu_batch1_tokens_per_s"] = {r["setting"]: r["tokens_per_s"] for r in rows}
            results["cpu_batch1_speedup_vs_fp32"] = {r["setting"]: r["speedup"] for r in rows}

        # 3. CPU decode step by batch size, and prefill
        if not args.skip_batch_table:
            batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
            prefill_tokens = args.prefill_tokens or (64 if args.quick else 512)
            print(f"\n3. decode step (ms) by batch size and a {prefill_tokens}-token prefill on the CPU, bf16 and "
                  f"fp32 activations: median [min-max] of {args.repeats} rotating repeats", flush=True)
            runs = batch_table(folders, batch_sizes, num_tokens, prefill_tokens, args.repeats)
            results["cpu_batch_table"] = show_batch_table(runs, batch_sizes, prefill_tokens)

        # 4. GPU decode at batch 1 and 16
        if torch.cuda.is_available():
            device = torch.device("cuda")
            print(f"\n4. decode on {torch.cuda.get_device_name(device)}, {num_tokens * 4} tokens, bf16 activations")
            gpu = {}
            for label in ("bf16", *SCHEMES):
                llm = LLM(folders[label], device="cuda", dtype="bfloat16", max_num_seqs=16, record_trace=False,
                          kv_cache_memory=256 << 20)
                kernel = "-" if label == "bf16" else llm.model.model.layers[0].mlp.up_proj.kernel.name
                gpu[label] = {b: batch_tokens_per_s(llm, b, num_tokens * 4, device) for b in (1, 16)}
                print(f"   {label:10} kernel {kernel:9} " + "  ".join(
                    f"batch {b}: {v:9.1f} tok/s {v / gpu['bf16'][b]:.2f}x" for b, v in gpu[label].items()), flush=True)
                del llm
                gc.collect()
                torch.cuda.empty_cache()
            results["gpu_tokens_per_s"] = {k: {str(b): v for b, v in d.items()} for k, d in gpu.items()}
            results["gpu"] = torch.cuda.get_device_name(device)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
