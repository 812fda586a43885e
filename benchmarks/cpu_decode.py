"""Batch-1 decode on a laptop-class CPU: this engine vs `transformers.generate` vs the floor.

Issue 22's table, measured in one process on a Qwen3-0.6B configuration (shapes from
`course/known_configs.py`) with random weights, written once as a bf16 checkpoint that every
system loads:

    1. batch-1 greedy decode after a 16-token prompt (48 tokens; the prefill is left out):
       tokens/s and step ms of minilm-engine (bf16 and fp32 activations), its readable decoder
       (`model/decoder.py`) and its fused CPU backend (`model_backend="fused"`,
       `model/fused.py`), and of `transformers.generate` on the same checkpoint and
       dtype, each against the weight-read
       floor: the bytes one decode step reads (every weight once; a tied head reads the
       embedding table) / the copy bandwidth of a large tensor copy, measured here
    2. decode at batch 4 and 16 (bf16), the engine (both backends) and `transformers.generate`
    3. llama.cpp through llama-cpp-python (the optional extra `llama`), only when `llama_cpp`
       is importable; otherwise the script says it skipped it, and why.  The same checkpoint is
       converted to GGUF by llama.cpp's own `convert_hf_to_gguf.py` and quantized to Q8_0 and
       Q4_0 by its own `llama_model_quantize` (`llama_cpp_baseline.py`, which says where it got
       the converter), and each is timed at batch 1 in the same rotation, against the engine at
       the same precision: bf16 (the fused backend), int8 and int4 g128 (weight-only, bf16
       activations; the LM head quantized too, `quantization_config={"lm_head": True}`, as
       llama.cpp's Q8_0 and Q4_0 files quantize their output matrix: Q8_0 and Q6_K)
    4. the shipped noodle-chef (fp32, the chapters' model) at batch 1, readable and fused,
       against its own weight-read floor: issue 22 asks for its step within 2x of that floor

Every system stays loaded; each repeat runs them one after another in a rotating order, so a
machine whose load changes moves every column, not one.  A cell is the median of its repeats
with their spread [min-max]; a ratio is the median of the per-repeat ratios.  A step is timed
by the gap between tokens: the engine's `metrics.tpot`, and for transformers a streamer that
stamps each token as `generate` hands it out.

    python benchmarks/cpu_decode.py --threads 2         # full size: several minutes
    python benchmarks/cpu_decode.py --quick             # a tiny config: seconds (the smoke test)
    python benchmarks/cpu_decode.py --json out.json
    pip install -e '.[llama]' && python benchmarks/cpu_decode.py   # with llama.cpp (builds it)
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
from dataclasses import dataclass
from pathlib import Path

import torch
from common import QUICK_OVERRIDES, QWEN3_0_6B, add_threads_option, apply_threads_option

from llama_cpp_baseline import build_ggufs, find_converter, llama_cpp_skip_reason, llama_cpp_step_ms

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.experiments.batching import measure_copy_bandwidth
from minilm_engine.course.experiments.quantization import write_random_qwen3
from minilm_engine.course.known_configs import KNOWN_CONFIGS
from minilm_engine.model.fused import PackedEmbedding

MODEL_ID = QWEN3_0_6B
CHEF = "noodle-chef"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny config (CI smoke test)")
    parser.add_argument("--tokens", type=int, default=None, help="decode tokens per run (default 48; 6 with --quick)")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--batch-sizes", default="4,16", help="part 2's batch sizes")
    parser.add_argument("--num-layers", type=int, default=None, help="fewer layers than the real model (faster)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per system (medians are reported)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--quantized", default="int8,int4",
                        help="the engine's weight-only schemes timed at batch 1 (bf16 activations); '' for none")
    parser.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even where it is installed")
    parser.add_argument("--llama-pairs-only", action="store_true",
                        help="only part 3's systems (fused bf16, the quantized engines, llama.cpp): minutes less")
    parser.add_argument("--llama-cpp-source", default=None,
                        help="a llama.cpp checkout holding convert_hf_to_gguf.py (default: $LLAMA_CPP_SOURCE, "
                             "else the installed llama-cpp-python's sdist, fetched with pip download)")
    # Decode of a 0.6B model reads ~1.2 GB per token: one core cannot keep the memory busy.
    add_threads_option(parser, default=os.cpu_count() or 1,
                       why="every core: one core cannot keep the memory busy for a model this size")
    return parser.parse_args(argv)


# -- the systems -----------------------------------------------------------------------------

@dataclass
class System:
    """One column of the comparison: a label, a dtype, and a function `step_ms(batch_size)` that
    decodes `num_tokens` greedy tokens for `batch_size` prompts and returns the step time."""

    label: str
    dtype: str
    step_ms: object  # Callable[[int], float]
    kind: str  # "minilm-engine", "transformers" or "llama.cpp"
    bytes_per_step: int | None = None  # what one batch-1 step reads (the engine's weights)
    backend: str | None = None  # the engine's model backend in use (it may have fallen back)
    batch1_only: bool = False  # quantized engines and llama.cpp: part 1 only


def prompt_ids(batch_size: int, num_tokens: int, vocab_size: int) -> list[list[int]]:
    """Distinct valid ids per row (no prefix-cache hits, nothing a tokenizer must agree on)."""
    return [[(7919 * (i + 1) + 31 * j) % (vocab_size - 10) + 10 for j in range(num_tokens)] for i in range(batch_size)]


def engine_system(folder: Path, dtype: str, label: str, num_tokens: int, prompt_tokens: int,
                  max_batch: int, **llm_args) -> System:
    llm = LLM(folder, dtype=DTYPES[dtype], max_num_seqs=max_batch, record_trace=False,
              enable_prefix_caching=False, kv_cache_memory=512 << 20, **llm_args)
    vocab = llm.config.vocab_size

    def step_ms(batch_size: int, n: int = num_tokens) -> float:
        # Every request decodes together, so one request's mean gap between tokens is one step.
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        prompts = [{"prompt_token_ids": p} for p in prompt_ids(batch_size, prompt_tokens, vocab)]
        outs = llm.generate(prompts, params, use_tqdm=False)
        return statistics.median(o.metrics.tpot for o in outs) * 1e3

    step_ms(1, 3)  # warm-up
    return System(label, dtype, step_ms, "minilm-engine", bytes_read_per_step(llm), llm.model_backend,
                  batch1_only="quantization" in llm_args)


class TokenClock:
    """A `transformers` streamer that only notes when each token came out: the first `put` is
    the prompt, the second the first new token (after the prefill), then one per decode step."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    def step_ms(self) -> float:
        decode = self.times[1:]  # from the first new token on
        return (decode[-1] - decode[0]) / (len(decode) - 1) * 1e3


def transformers_system(folder: Path, dtype: str, num_tokens: int, prompt_tokens: int) -> System:
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPES[dtype]).eval()
    vocab = model.config.vocab_size

    def step_ms(batch_size: int, n: int = num_tokens) -> float:
        ids = torch.tensor(prompt_ids(batch_size, prompt_tokens, vocab))
        config = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                  pad_token_id=0, eos_token_id=model.config.eos_token_id)
        clock = TokenClock()
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config,
                           streamer=clock)
        return clock.step_ms()

    step_ms(1, 3)  # warm-up
    return System(f"transformers.generate, {dtype}", dtype, step_ms, "transformers")


# -- the floor -------------------------------------------------------------------------------

def bytes_read_per_step(llm: LLM) -> int:
    """What one batch-1 decode step reads: every weight once, except the embedding table (a
    lookup reads one row) unless the head is that table (tied)."""
    embedding = llm.model.model.embed_tokens
    if isinstance(embedding, PackedEmbedding):  # the fused bf16 path: the table lives in the head
        return llm.weight_bytes
    table = embedding.weight
    tied = getattr(llm.model.lm_head, "weight", None) is table
    return llm.weight_bytes - (0 if tied else table.numel() * table.element_size())


# -- the table -------------------------------------------------------------------------------

def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(s: dict, digits: int = 1) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def chef_system(backend: str, num_tokens: int, prompt_tokens: int) -> System:
    """The shipped noodle-chef (fp32) on `backend`, batch 1 only (part 4)."""
    system = engine_system(CHEF, "fp32", f"noodle-chef {backend}, fp32", num_tokens, prompt_tokens, max_batch=1,
                           model_backend=backend)
    system.kind, system.batch1_only = "chef", True
    return system


def run_repeats(systems: list[System], batch_sizes: list[int], repeats: int, bandwidth_bytes: int) -> dict:
    """{"bandwidth": [B/s per repeat], (label, batch): [step ms per repeat]}, rotating who goes first."""
    runs: dict = {"bandwidth": []}
    for r in range(repeats):
        runs["bandwidth"].append(measure_copy_bandwidth(num_bytes=bandwidth_bytes, num_repeats=3))
        for b in [1, *batch_sizes]:
            order = systems if b == 1 else [s for s in systems if s.dtype == "bf16" and not s.batch1_only]
            shift = r % len(order)
            for system in order[shift:] + order[:shift]:
                runs.setdefault((system.label, b), []).append(system.step_ms(b))
        print(f"   repeat {r + 1}/{repeats} done", flush=True)
    return runs


def batch1_table(systems: list[System], runs: dict, floor_bytes: dict[str, int]) -> dict:
    """Part 1: per system tokens/s, step ms, the ratio to transformers at its dtype and the
    share of the floor, each as median [min-max] (ratios: median of per-repeat ratios)."""
    bandwidth = runs["bandwidth"]
    rows = {}
    print(f"   {'':40} {'tok/s':>20} {'step ms':>22} {'vs transformers':>16} {'vs reference':>13} {'of floor':>10}")
    for system in [s for s in systems if s.kind != "chef"]:
        steps = runs[(system.label, 1)]
        base = runs[(f"transformers.generate, {system.dtype}", 1)]
        readable = runs[(f"minilm-engine reference, {system.dtype}", 1)]
        # The floor of what this system reads: its own weights (a quantized engine reads fewer
        # bytes), the engine's at this dtype for transformers.
        floors = [(system.bytes_per_step or floor_bytes[system.dtype]) / bw * 1e3 for bw in bandwidth]
        row = {"tokens_per_s": spread([1e3 / s for s in steps]), "step_ms": spread(steps),
               "vs_transformers": statistics.median(b / s for b, s in zip(base, steps)),
               "vs_reference": statistics.median(b / s for b, s in zip(readable, steps)),
               "of_floor": statistics.median(f / s for f, s in zip(floors, steps)), "runs_ms": steps}
        rows[system.label] = row
        print(f"   {system.label:40} {fmt(row['tokens_per_s']):>20} {fmt(row['step_ms']):>22} "
              f"{row['vs_transformers']:15.2f}x {row['vs_reference']:12.2f}x {row['of_floor']:9.0%}", flush=True)
    return rows


def batch_table(systems: list[System], runs: dict, batch_sizes: list[int]) -> dict:
    """Part 2: tokens/s (all rows of the batch) per bf16 system and batch size, and the ratio to
    transformers at that batch size."""
    rows = {}
    bf16 = [s for s in systems if s.dtype == "bf16" and not s.batch1_only]
    print(f"   {'':40}" + "".join(f"{f'batch {b}: tok/s':>24} {'vs hf':>6}" for b in batch_sizes))
    for system in bf16:
        cells, text = {}, ""
        for b in batch_sizes:
            steps, base = runs[(system.label, b)], runs[("transformers.generate, bf16", b)]
            cells[str(b)] = {"tokens_per_s": spread([b * 1e3 / s for s in steps]), "step_ms": spread(steps),
                             "vs_transformers": statistics.median(h / s for h, s in zip(base, steps))}
            text += f"{fmt(cells[str(b)]['tokens_per_s']):>24} {cells[str(b)]['vs_transformers']:5.2f}x"
        rows[system.label] = cells
        print(f"   {system.label:40}" + text, flush=True)
    return rows


# Issue 22's table: llama.cpp's GGUF -> the engine system at the same precision.
LLAMA_PAIRS = {"bf16": "minilm-engine fused, bf16", "q8_0": "minilm-engine int8, bf16",
               "q4_0": "minilm-engine int4, bf16"}


def llama_table(runs: dict, labels: set[str]) -> dict:
    """Part 3: llama.cpp and the engine at each precision, tokens/s and the engine / llama.cpp
    speed ratio (median of the per-repeat ratios)."""
    rows = {}
    print(f"   {'precision':10} {'llama.cpp tok/s':>20} {'minilm-engine tok/s':>22} {'ratio':>7}")
    for gguf, engine in LLAMA_PAIRS.items():
        llama = f"llama.cpp {gguf}"
        if llama not in labels or engine not in labels:
            continue
        theirs, ours = runs[(llama, 1)], runs[(engine, 1)]
        row = {"llama_cpp": spread([1e3 / s for s in theirs]), "engine": engine,
               "engine_tokens_per_s": spread([1e3 / s for s in ours]),
               "ratio": statistics.median(t / o for t, o in zip(theirs, ours))}  # > 1: the engine is faster
        rows[gguf] = row
        print(f"   {gguf:10} {fmt(row['llama_cpp']):>20} {fmt(row['engine_tokens_per_s']):>22} {row['ratio']:6.2f}x"
              f"   ({engine})", flush=True)
    return rows


def chef_table(systems: list[System], runs: dict) -> dict:
    """Part 4: the shipped chef's step against its own floor (its weights over the copy
    bandwidth), as the ratio step / floor per repeat: issue 22's goal is <= 2x."""
    rows = {}
    print(f"   {'':40} {'step ms':>22} {'floor ms':>10} {'step / floor':>14}")
    for system in [s for s in systems if s.kind == "chef"]:
        steps = runs[(system.label, 1)]
        floors = [system.bytes_per_step / bw * 1e3 for bw in runs["bandwidth"]]
        ratios = [s / f for s, f in zip(steps, floors)]
        row = {"step_ms": spread(steps), "floor_ms": spread(floors), "step_over_floor": spread(ratios),
               "bytes_per_step": system.bytes_per_step, "backend": system.backend, "runs_ms": steps}
        rows[system.label] = row
        print(f"   {system.label:40} {fmt(row['step_ms'], 2):>22} {row['floor_ms']['median']:10.2f} "
              f"{fmt(row['step_over_floor'], 2):>14}", flush=True)
    return rows


def llama_systems(args, folder: Path, out_dir: Path, num_tokens: int, vocab_size: int, results: dict) -> list[System]:
    """llama.cpp at bf16, Q8_0 and Q4_0, or none (and why, in `results`)."""
    reason = "--no-llama-cpp" if args.no_llama_cpp else llama_cpp_skip_reason()
    if reason is not None:
        results["llama_cpp"] = {"skipped": reason}
        print(f"llama.cpp: skipped: {reason}", flush=True)
        return []
    import llama_cpp

    converter_dir, where = find_converter(args.llama_cpp_source)
    t0 = time.perf_counter()
    paths = build_ggufs(folder, out_dir, converter_dir, torch.get_num_threads())
    results["llama_cpp"] = {"version": llama_cpp.__version__, "converter": where,
                            "gguf_bytes": {name: p.stat().st_size for name, p in paths.items()}}
    print(f"llama.cpp {llama_cpp.__version__}: GGUFs built in {time.perf_counter() - t0:.0f} s with "
          f"convert_hf_to_gguf.py from {where} and llama_model_quantize", flush=True)
    (prompt,) = prompt_ids(1, args.prompt_tokens, vocab_size)
    systems = []
    for name, path in paths.items():
        step_ms = llama_cpp_step_ms(path, torch.get_num_threads(), num_tokens, prompt)
        if step_ms.note:
            results["llama_cpp"].setdefault("notes", []).append(step_ms.note)
        systems.append(System(f"llama.cpp {name}", "bf16", step_ms, "llama.cpp",
                              bytes_per_step=path.stat().st_size, batch1_only=True))  # the file: ~the weights
    return systems


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_threads_option(args)
    num_tokens = args.tokens or (6 if args.quick else 48)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    results: dict = {"model": f"{MODEL_ID} shape{' (tiny, --quick)' if args.quick else ''}, random weights",
                     "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                            f"{torch.get_num_threads()} torch threads",
                     "torch": torch.__version__, "num_tokens": num_tokens, "prompt_tokens": args.prompt_tokens,
                     "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "bf16"
        fields = {k: v for k, v in KNOWN_CONFIGS[MODEL_ID].items() if k not in ("architectures", "torch_dtype")}
        fields.update(QUICK_OVERRIDES if args.quick else {})
        if args.num_layers:
            fields["num_hidden_layers"] = args.num_layers
        t0 = time.perf_counter()
        write_random_qwen3(folder, **fields)
        gc.collect()
        max_batch = max([1, *batch_sizes])
        common = dict(num_tokens=num_tokens, prompt_tokens=args.prompt_tokens)
        pairs_only = args.llama_pairs_only
        if pairs_only:
            batch_sizes = []
        engines = [("bf16", "fused")] if pairs_only else [(d, b) for d in DTYPES for b in ("reference", "fused")]
        systems = [engine_system(folder, d, f"minilm-engine {backend}, {d}", max_batch=max_batch,
                                 model_backend=backend, **common) for d, backend in engines]
        systems += [engine_system(folder, "bf16", f"minilm-engine {scheme}, bf16", max_batch=1,
                                  quantization=scheme, quantization_config={"lm_head": True}, **common)
                    for scheme in args.quantized.split(",") if scheme]
        systems += [] if pairs_only else [transformers_system(folder, d, **common) for d in DTYPES]
        systems += llama_systems(args, folder, Path(tmp), num_tokens, fields["vocab_size"], results)
        systems += [] if pairs_only else [chef_system(backend, **common) for backend in ("reference", "fused")]
        print(f"checkpoint written, {len(systems)} systems loaded and warmed up in {time.perf_counter() - t0:.1f} s",
              flush=True)
        floor_bytes = {s.dtype: s.bytes_per_step for s in systems
                       if s.kind == "minilm-engine" and not s.batch1_only}  # reference and fused read the same
        results["model_backends"] = {s.label: s.backend for s in systems if s.kind in ("minilm-engine", "chef")}

        print(f"\n{results['model']}; {results['cpu']}; torch {torch.__version__}")
        print(f"{num_tokens} greedy tokens after a {args.prompt_tokens}-token prompt; median [min-max] of "
              f"{args.repeats} alternating repeats", flush=True)
        bandwidth_bytes = 1 << (24 if args.quick else 28)
        runs = run_repeats(systems, batch_sizes, args.repeats, bandwidth_bytes)
        bw = spread([b / 1e9 for b in runs["bandwidth"]])
        results["copy_bandwidth_GBps"] = bw
        results["floor"] = {d: {"bytes_per_step": n, "ms": n / (bw["median"] * 1e9) * 1e3} for d, n in floor_bytes.items()}
        print(f"\nweight-read floor: copy bandwidth of a {bandwidth_bytes >> 20} MiB tensor {fmt(bw)} GB/s; "
              + ", ".join(f"{d} {f['bytes_per_step'] / 1e6:,.0f} MB a step -> {f['ms']:.1f} ms "
                          f"({1e3 / f['ms']:.1f} tok/s)" for d, f in results["floor"].items()))

        if not pairs_only:
            print("\n1. batch-1 decode")
            results["batch1"] = batch1_table(systems, runs, floor_bytes)
        if batch_sizes:
            print(f"\n2. decode at batch {' and '.join(map(str, batch_sizes))}, bf16 (tokens/s of the whole batch)")
            results["batches"] = batch_table(systems, runs, batch_sizes)
        if "skipped" in results["llama_cpp"]:
            print(f"\n3. llama.cpp: skipped: {results['llama_cpp']['skipped']}")
        else:
            print("\n3. llama.cpp (llama-cpp-python) against the engine at the same precision, batch 1")
            results["llama_cpp"]["table"] = llama_table(runs, {s.label for s in systems})
        if not pairs_only:
            print(f"\n4. the shipped noodle-chef (fp32) at batch 1 against its own floor ({CHEF})")
            results["chef"] = chef_table(systems, runs)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
