"""Output tokens/s on the workload small-engine projects compare on, against `transformers`.

A Qwen3-0.6B configuration (shapes from `course/known_configs.py`) with random weights, so
nothing is downloaded; greedy decoding, EOS ignored, seed 0 for everything:

    A. 256 requests, input lengths uniform in [100, 1024], output lengths uniform in [100, 1024]
       (nano-vllm's bench.py workload)                        -> minilm-engine
    B. the same prompts, 256 output tokens each               -> minilm-engine,
       `transformers.generate` in static batches of 64 (left padding, each batch runs 256 steps),
       and `transformers`' own continuous batching (`model.generate_batch`)
    C. batch-1 decode tokens/s of one request, against the bandwidth ceiling
       (measured copy bandwidth / weight bytes: every weight is read once per token); on a GPU
       also with CUDA graphs off (`enforce_eager=True`), which shows what the graphs buy

Every run is warmed up first (Triton compiles its kernels; transformers captures CUDA graphs),
then timed once: output tokens / wall time of the whole run, prefill included.  Results are
printed as they come and, with --json, rewritten to a file after each run, so a run stopped by a
time limit keeps what it measured, and a run that fails is reported and skipped.  Both engines
get a KV cache with room for all of workload B at once (minilm-engine: for all of A, if the
GPU has room), and the same token budget per step (8192) and batch limit (256 requests).

    python benchmarks/throughput.py                    # a GPU: a few minutes
    python benchmarks/throughput.py --quick            # a tiny config, 8 requests: CPU, ~1 minute
    python benchmarks/throughput.py --cpu-compare      # the real shape on a CPU, B and batch 1 only:
                                                       # 16 requests of 42-248 tokens, 32 out each,
                                                       # 2 threads, vs transformers.generate, batch 1
                                                       # alternating 3 times (~5 min)
    python benchmarks/throughput.py --skip-hf          # minilm-engine only
    python benchmarks/throughput.py --json results.json
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import inspect
import json
import logging
import os
import platform
import random
import sys
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from common import add_threads_option, apply_threads_option, hf_generate_static, sync

from minilm_engine import LLM, SamplingParams
from minilm_engine.model.attention.backends import ATTENTION_BACKENDS
from minilm_engine.model.device import resolve_dtype
from minilm_engine.course.experiments.batching import measure_copy_bandwidth, weight_bytes
from minilm_engine.course.experiments.launches import decode_tokens_per_s
from minilm_engine.course.known_configs import KNOWN_CONFIGS
from minilm_engine.model.loader import read_config, resolve_model_path

MODEL_ID = "Qwen/Qwen3-0.6B"
# --quick: the same family, tiny, so every path (transformers' included) runs on a CPU.
QUICK_OVERRIDES = dict(
    vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
    bos_token_id=1, eos_token_id=2,
)
# --cpu-compare: Qwen3-0.6B's real shape, a workload a CPU finishes in minutes, and only the two
# comparisons with transformers.generate (static batches, batch 1); goal >= 1.0x on both.
CPU_COMPARE_DEFAULTS = dict(
    device="cpu", num_requests=16, min_input=32, max_input=248, fixed_output=32, hf_batch=16,
    batch1_tokens=32, threads=2, skip_a=True, skip_hf_continuous=True,
)
QUICK_DEFAULTS = dict(
    num_requests=8, min_input=16, max_input=64, min_output=16, max_output=48, fixed_output=16,
    hf_batch=4, max_num_batched_tokens=256, batch1_tokens=32, hf_page_size=32,
)


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]  # token ids
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    def describe(self) -> str:
        ins = [len(p) for p in self.prompts]
        outs = self.output_lens
        return (f"{self.name}: {len(ins)} requests, input {min(ins)}-{max(ins)} tokens (sum {sum(ins):,}), "
                f"output {min(outs)}-{max(outs)} tokens (sum {sum(outs):,})")


@dataclass
class Result:
    system: str
    workload: str
    num_output_tokens: int
    seconds: float
    note: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.seconds


def make_workloads(args, vocab_size: int) -> tuple[Workload, Workload]:
    rng = random.Random(args.seed)
    lens = [rng.randint(args.min_input, args.max_input) for _ in range(args.num_requests)]
    prompts = [[rng.randrange(vocab_size) for _ in range(n)] for n in lens]
    outs = [rng.randint(args.min_output, args.max_output) for _ in range(args.num_requests)]
    return (Workload("A (random outputs)", prompts, outs),
            Workload(f"B ({args.fixed_output} out each)", prompts, [args.fixed_output] * len(prompts)))


# -- the model -------------------------------------------------------------------------------


def hf_config(quick: bool):
    from transformers import Qwen3Config

    fields = {k: v for k, v in KNOWN_CONFIGS[MODEL_ID].items() if k not in ("architectures", "torch_dtype")}
    if quick:
        fields.update(QUICK_OVERRIDES)
    return Qwen3Config(**fields)


def build_checkpoint(config, folder: Path, device: torch.device, dtype: torch.dtype, seed: int):
    """Random Qwen3 weights written with `save_pretrained`, plus a tokenizer (any one will do: the
    prompts are token ids, and ids the tokenizer does not know decode to nothing)."""
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    model = model.to(dtype).eval()
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(resolve_model_path("noodle-chef")).save_pretrained(folder)
    return model


def kv_budget_bytes(args, kv_bytes_per_token: int, workload: Workload, device: torch.device) -> int:
    """Room for every request of `workload` at its full length (no preemption), capped at a
    share of the free GPU memory (1 GiB on a CPU)."""
    needed = sum(len(p) + n for p, n in zip(workload.prompts, workload.output_lens)) * kv_bytes_per_token
    if device.type != "cuda":
        return min(needed, 1 << 30)
    free, _ = torch.cuda.mem_get_info(device)
    return int(min(1.1 * needed, args.kv_memory_fraction * free))


# -- minilm-engine -------------------------------------------------------------------------


def run_minilm(llm: LLM, workload: Workload, device) -> Result:
    prompts = [{"prompt_token_ids": p} for p in workload.prompts]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in workload.output_lens]
    sync(device)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    sync(device)
    seconds = time.perf_counter() - start
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return Result("minilm-engine", workload.name, num_tokens, seconds, check_count(num_tokens, workload))


def check_count(num_tokens: int, workload: Workload) -> str:
    expected = workload.num_output_tokens
    return "" if num_tokens == expected else f"produced {num_tokens} of {expected} tokens!"


# -- transformers ----------------------------------------------------------------------------


def hf_static(model, workload: Workload, batch_size: int) -> Result:
    """`transformers.generate` with static batching (benchmarks/common.py) on the workload."""
    num_tokens, seconds = hf_generate_static(
        model, workload.prompts, workload.output_lens, batch_size
    )
    return Result(f"transformers.generate (static, batch {batch_size})", workload.name, num_tokens,
                  seconds, check_count(num_tokens, workload))


def hf_batch1_tokens_per_s(model, prompt: list[int], num_tokens: int, device) -> float:
    """Decode tokens/s of one request: (time for n tokens - time for 1) / (n - 1).  Warm the
    model up first (`num_tokens=2`)."""
    from transformers import GenerationConfig

    ids = torch.tensor([prompt], device=device)

    def timed(n: int) -> float:
        config = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                                  eos_token_id=model.config.eos_token_id)
        sync(device)
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        sync(device)
        return time.perf_counter() - start

    return (num_tokens - 1) / (timed(num_tokens) - timed(1))


def hf_continuous_batching(model, workload: Workload, args, kv_budget: int, kv_bytes_per_token: int,
                           device) -> Result:
    """`model.generate_batch`, with an explicit KV-cache size and token budget (left to itself it
    sizes its cache from free memory).  A warm-up call with a persistent manager captures the
    CUDA graphs; the timed call reuses that manager."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    page_size = args.hf_page_size
    n = workload.output_lens[0]
    assert all(m == n for m in workload.output_lens), "generate_batch takes one max_new_tokens"
    longest = max(len(p) for p in workload.prompts) + n
    # The page size is `block_size` in transformers 5.17 and `page_size` in 5.25; 5.17 has no
    # `auto_switch_to_flash`: a keyword the installed version lacks is left out.
    accepted = inspect.signature(ContinuousBatchingConfig.__init__).parameters
    options = dict(
        page_size=page_size,
        num_blocks=max(1, kv_budget // (page_size * kv_bytes_per_token)),
        max_batch_tokens=args.max_num_batched_tokens,
        max_requests_per_batch=args.max_num_seqs,
        max_blocks_per_request=-(-longest // page_size),  # else guessed from the first call's prompts
        # Flash attention only if it is installed here; otherwise transformers may try to fetch
        # a kernel from the hub, and the benchmark machine may be offline.
        auto_switch_to_flash=importlib.util.find_spec("flash_attn") is not None,
    )
    if "page_size" not in accepted:
        options["block_size"] = options.pop("page_size")
    cb_config = ContinuousBatchingConfig(**{k: v for k, v in options.items() if k in accepted})
    # Its logger warns that a persistent manager is sized for its first workload: we size it.
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
    try:
        # no_grad, not inference_mode: the manager's generation loop runs in its own thread, where
        # inference mode is off, and zeroes tensors made here (transformers 5.17 refuses that).
        with torch.no_grad():
            warm = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=-1)  # -1: no EOS
            model.generate_batch(inputs=workload.prompts[:4], generation_config=warm,
                                 continuous_batching_config=cb_config, persistent_manager=True)
            gen_config = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=-1)
            sync(device)
            start = time.perf_counter()
            results = model.generate_batch(inputs=workload.prompts, generation_config=gen_config,
                                           continuous_batching_config=cb_config, persistent_manager=True)
            sync(device)
            seconds = time.perf_counter() - start
    finally:
        model.destroy_cached_continuous_batching_manager()
    num_tokens = sum(len(r.generated_tokens) for r in results.values())
    note = check_count(num_tokens, workload)
    note += f" attention: {model.config._attn_implementation}, {cb_config.num_blocks} blocks of {page_size}"
    return Result("transformers generate_batch (continuous)", workload.name, num_tokens, seconds, note.strip())


# -- the run -----------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--min-input", type=int, default=100)
    p.add_argument("--max-input", type=int, default=1024)
    p.add_argument("--min-output", type=int, default=100)
    p.add_argument("--max-output", type=int, default=1024)
    p.add_argument("--fixed-output", type=int, default=256, help="output tokens of workload B")
    p.add_argument("--hf-batch", type=int, default=64, help="static batch size of transformers.generate")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--batch1-tokens", type=int, default=256, help="output tokens of the batch-1 run")
    p.add_argument("--batch1-repeats", type=int, default=3,
                   help="batch-1 runs of each system, alternating (the median is reported)")
    p.add_argument("--kv-memory-fraction", type=float, default=0.3,
                   help="most of the free GPU memory each engine's KV cache may take")
    p.add_argument("--hf-page-size", type=int, default=256, help="tokens per block of transformers' cache")
    p.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS,
                   help="minilm-engine's attention (auto: Triton on a GPU; on a CPU 'triton' needs "
                        "TRITON_INTERPRET=1, slow)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="no CUDA graphs for minilm-engine's decode steps (they are on by default on CUDA)")
    p.add_argument("--skip-hf", action="store_true", help="run minilm-engine only")
    p.add_argument("--skip-hf-static", action="store_true",
                   help="skip transformers.generate's static batches on A and B (batch 1 still runs)")
    p.add_argument("--skip-a", action="store_true", help="skip workload A (the longest run)")
    p.add_argument("--skip-hf-continuous", action="store_true",
                   help="skip transformers' generate_batch (slow on a CPU)")
    p.add_argument("--cpu-compare", action="store_true",
                   help="the real shape on a CPU against transformers.generate only (see the docstring)")
    p.add_argument("--quick", action="store_true", help="a tiny config and 8 short requests (CPU smoke test)")
    p.add_argument("--json", type=Path, default=None, help="write results here after every run")
    p.add_argument("--seed", type=int, default=0)
    add_threads_option(p)
    # --quick changes the defaults only: `--quick --num-requests 64` still means 64 requests.
    known = p.parse_known_args(argv)[0]
    if known.quick:
        p.set_defaults(**QUICK_DEFAULTS)
    if known.cpu_compare:
        p.set_defaults(**CPU_COMPARE_DEFAULTS)
    args = p.parse_args(argv)
    args.max_num_seqs = min(args.max_num_seqs, args.num_requests)
    return args


def versions() -> dict[str, str]:
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = "not installed"
    return out


class Report:
    """Collects results, prints each one, rewrites --json after each."""

    def __init__(self, path: Path | None, header: dict):
        self.path, self.header, self.results, self.extra = path, header, [], {}
        self.errors: dict[str, str] = {}

    def attempt(self, label: str, fn) -> None:
        """Run one step of the benchmark; a failure is printed and recorded, not raised."""
        start = time.perf_counter()
        try:
            fn()
        except Exception as e:  # an API change, an out-of-memory: say so and go on
            self.errors[label] = f"{type(e).__name__}: {e}"[:500]
            print(f"  {label} FAILED: {self.errors[label]}", flush=True)
            self.save()
            return
        print(f"  ({label}: {time.perf_counter() - start:.1f} s)", flush=True)

    def add(self, result: Result) -> Result:
        self.results.append(result)
        print(f"  {result.system:<44} {result.workload:<22} {result.num_output_tokens:>8,} tokens "
              f"{result.seconds:8.2f} s {result.tokens_per_s:10,.0f} tok/s {result.note}", flush=True)
        self.save()
        return result

    def set(self, **values) -> None:
        self.extra.update(values)
        def show(v):
            return "[" + ", ".join(map(show, v)) + "]" if isinstance(v, list) else f"{v:,.4g}"

        print("  " + ", ".join(f"{k} = {show(v)}" for k, v in values.items()), flush=True)
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        data = {**self.header, **self.extra, "errors": self.errors,
                "results": [{**asdict(r), "tokens_per_s": r.tokens_per_s} for r in self.results]}
        self.path.write_text(json.dumps(data, indent=2))

    def table(self) -> None:
        print("\n" + "=" * 100)
        for key, value in self.header.items():
            print(f"{key:>14}: {value}")
        print("-" * 100)
        print(f"{'run':<44} {'workload':<22} {'out tokens':>10} {'time s':>8} {'out tok/s':>10} {'vs this':>8}")
        ours = {r.workload: r for r in self.results if r.system.startswith("minilm")}
        for r in self.results:
            ref = ours.get(r.workload)
            compared = ref is not None and r is not ref and r.tokens_per_s > 0  # a failed run made 0 tokens
            ratio = f"{ref.tokens_per_s / r.tokens_per_s:7.2f}x" if compared else ""
            print(f"{r.system:<44} {r.workload:<22} {r.num_output_tokens:>10,} {r.seconds:8.2f} "
                  f"{r.tokens_per_s:10,.0f} {ratio:>8}")
        print("('vs this': minilm-engine's tokens/s divided by this run's, same workload)")
        b1 = self.extra
        if "ceiling_tokens_per_s" in b1:
            print("-" * 100)
            print(f"batch-1 decode ceiling: {b1['copy_bandwidth_GBps']:.0f} GB/s copy bandwidth / "
                  f"{b1['weight_GB']:.3g} GB of weights = {b1['ceiling_tokens_per_s']:,.0f} tokens/s")
            for name, who in (("minilm_batch1_tokens_per_s", "minilm-engine"),
                              ("minilm_eager_batch1_tokens_per_s", "minilm-engine, eager"),
                              ("hf_batch1_tokens_per_s", "transformers.generate")):
                if name in b1:
                    print(f"batch-1 decode, {who:<22} {b1[name]:8,.0f} tokens/s = "
                          f"{b1[name] / b1['ceiling_tokens_per_s']:6.1%} of the ceiling")
            if "minilm_eager_batch1_tokens_per_s" in b1 and "minilm_batch1_tokens_per_s" in b1:
                print(f"CUDA graphs at batch 1: {b1['minilm_batch1_tokens_per_s'] / b1['minilm_eager_batch1_tokens_per_s']:.2f}x "
                      f"the eager tokens/s")
        static = [r for r in self.results if r.system.startswith("transformers.generate")]
        if static and static[0].workload in ours:
            print("-" * 100)
            ratio = ours[static[0].workload].tokens_per_s / static[0].tokens_per_s
            print(f"minilm-engine vs {static[0].system}: {ratio:.2f}x tokens/s (goal >= 1.0x)")
        if "batch1_pair_ratios" in b1:
            ratios = b1["batch1_pair_ratios"]
            pairs = f"median of {len(ratios)} alternating runs: " + ", ".join(f"{r:.2f}x" for r in ratios)
            print(f"minilm-engine vs transformers.generate at batch 1: {statistics.median(ratios):.2f}x tokens/s "
                  f"(goal >= 1.0x; {pairs})")
        for label, error in self.errors.items():
            print(f"FAILED {label}: {error}")
        print("=" * 100)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    apply_threads_option(args)
    dtype = resolve_dtype("auto", device)  # bf16 where native, fp16 on a T4, fp32 on a CPU
    config = hf_config(args.quick)
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads")
    workload_a, workload_b = make_workloads(args, config.vocab_size)
    print(workload_a.describe())
    print(workload_b.describe())

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen3-random"
        t0 = time.perf_counter()
        hf_model = build_checkpoint(config, folder, device, dtype, args.seed)
        print(f"random {'tiny ' if args.quick else ''}Qwen3 checkpoint written in {time.perf_counter() - t0:.1f} s",
              flush=True)
        kv_bytes_per_token = read_config(folder).kv_bytes_per_token(dtype.itemsize)
        kv_budget = kv_budget_bytes(args, kv_bytes_per_token, workload_a, device)
        # transformers runs B only: room for all of B at once, as minilm-engine has.
        hf_kv_budget = min(kv_budget, kv_budget_bytes(args, kv_bytes_per_token, workload_b, device))
        t0 = time.perf_counter()
        llm = LLM(
            folder, device=device, dtype=dtype, seed=args.seed,
            max_model_len=args.max_input + max(args.max_output, args.fixed_output, args.batch1_tokens) + 1,
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
            kv_cache_memory=kv_budget, attention_backend=args.attention_backend,
            enforce_eager=args.enforce_eager, record_trace=False,
        )
        # Batch 1 is where CUDA graphs matter most: a second, small engine runs it eagerly.
        eager_llm = None
        if llm.engine.decode_graphs is not None:
            prompt_len = len(workload_b.prompts[0])
            eager_llm = LLM(
                folder, device=device, dtype=dtype, seed=args.seed, max_model_len=llm.max_model_len,
                max_num_seqs=1, kv_cache_memory=(prompt_len + args.batch1_tokens + 64) * kv_bytes_per_token,
                attention_backend=args.attention_backend, enforce_eager=True, record_trace=False,
            )
        print(f"minilm-engine built in {time.perf_counter() - t0:.1f} s (CUDA graph capture included)", flush=True)
    engine = llm.engine
    graphs = engine.decode_graphs
    graphs_note = (f"CUDA graphs for decode steps, {len(graphs.buckets)} batch sizes up to {graphs.max_batch_size}"
                   if graphs is not None else "no CUDA graphs (eager)")
    header = {
        "hardware": hardware,
        **versions(),
        "model": (f"{MODEL_ID} config{' (tiny, --quick)' if args.quick else ''}, random weights, "
                  f"{llm.num_parameters / 1e6:.3g}M parameters, {str(dtype).removeprefix('torch.')}"),
        "minilm-engine": (f"attention backend {engine.attention_backend.name}, max_num_seqs {args.max_num_seqs}, "
                          f"max_num_batched_tokens {args.max_num_batched_tokens}, KV cache "
                          f"{engine.block_pool.num_blocks} blocks x {engine.block_manager.block_size} tokens "
                          f"= {kv_budget / 2**20:,.1f} MiB, {graphs_note}"),
        "workload A": workload_a.describe().split(": ", 1)[1],
        "workload B": workload_b.describe().split(": ", 1)[1],
    }
    report = Report(args.json, header)
    print(f"minilm-engine: {header['minilm-engine']}", flush=True)
    if args.skip_hf:
        del hf_model
        hf_model = None

    # Warm-up: Triton compiles its kernels on first use.
    report.attempt("minilm-engine warm-up", lambda: run_minilm(llm, Workload("warm-up", workload_b.prompts[:4], [8] * 4), device))

    # B first: the comparison with transformers is what this benchmark is for.
    report.attempt("minilm-engine on B", lambda: report.add(run_minilm(llm, workload_b, device)))
    if hf_model is not None:
        warm = Workload("warm-up", workload_b.prompts[:2], [4, 4])
        if not args.skip_hf_static:
            report.attempt("transformers.generate warm-up", lambda: hf_static(hf_model, warm, 2))
            report.attempt("transformers.generate on B",
                           lambda: report.add(hf_static(hf_model, workload_b, args.hf_batch)))
        if not args.skip_hf_continuous:
            report.attempt("transformers generate_batch on B", lambda: report.add(hf_continuous_batching(
                hf_model, workload_b, args, hf_kv_budget, kv_bytes_per_token, device)))

    # C: batch-1 decode against the bandwidth ceiling.
    def ceiling():
        bandwidth = measure_copy_bandwidth(num_bytes=1 << (30 if device.type == "cuda" else 26), device=device)
        num_weight_bytes = weight_bytes(llm.model)
        report.set(copy_bandwidth_GBps=bandwidth / 1e9, weight_GB=num_weight_bytes / 1e9,
                   ceiling_tokens_per_s=bandwidth / num_weight_bytes)

    prompt = workload_b.prompts[0]  # token ids
    engine_prompt = {"prompt_token_ids": prompt}
    report.attempt("copy bandwidth", ceiling)

    def batch1_pairs():
        """minilm-engine and transformers alternate, so that a change in the machine's load
        between two runs cannot decide the comparison: the ratio is the median of the pairs'."""
        decode_tokens_per_s(llm, engine_prompt, 4)  # warm-ups
        if hf_model is not None:
            hf_batch1_tokens_per_s(hf_model, prompt, 2, device)
        ours, theirs = [], []
        for _ in range(args.batch1_repeats):
            ours.append(decode_tokens_per_s(llm, engine_prompt, args.batch1_tokens))
            if hf_model is not None:
                theirs.append(hf_batch1_tokens_per_s(hf_model, prompt, args.batch1_tokens, device))
        report.set(minilm_batch1_tokens_per_s=statistics.median(ours), minilm_batch1_runs=ours)
        if theirs:
            report.set(hf_batch1_tokens_per_s=statistics.median(theirs), hf_batch1_runs=theirs,
                       batch1_pair_ratios=[a / b for a, b in zip(ours, theirs)])

    report.attempt("batch-1, minilm-engine and transformers alternating", batch1_pairs)
    if eager_llm is not None:
        def eager_batch1():
            decode_tokens_per_s(eager_llm, engine_prompt, 8)  # warm-up
            report.set(minilm_eager_batch1_tokens_per_s=decode_tokens_per_s(
                eager_llm, engine_prompt, args.batch1_tokens))

        report.attempt("minilm-engine batch-1, eager", eager_batch1)
        del eager_llm
    if hf_model is not None:
        del hf_model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()

    # A last: the longest run.
    if not args.skip_a:
        report.attempt("minilm-engine on A", lambda: report.add(run_minilm(llm, workload_a, device)))
    report.table()
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
