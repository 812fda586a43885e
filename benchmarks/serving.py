"""The serving core, measured: five ratios from one run on the shipped model.

Each line runs two configurations side by side in this process (alternating, best of
`--repeats`, because a shared machine is noisy) and prints their ratio.  Throughput (1 and 2)
is timed in CPU seconds of this process (`time.process_time`): with one thread (the default)
that is the wall time of an idle machine, and other programs on a busy one do not inflate it.
Latencies (4 and 5) are wall time.

1. throughput: continuous batching vs static batching on a mixed-length workload, with what a
   step of each costs at the same number of running requests, the engine's share of the
   speedup the toy simulator's step counts allow, and a workload with a wider spread of
   output lengths
2. throughput: the continuous engine vs `transformers.generate` with padded static batches
3. capacity: requests that fit one KV budget, paged vs contiguous max-length reservation
4. TTFT with a long shared system prompt, prefix caching on vs off
5. worst decode stall when a long prompt arrives, chunked prefill vs not

    python benchmarks/serving.py            # about 3-5 minutes on a laptop CPU
    python benchmarks/serving.py --quick    # smaller workloads, a smoke test
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
from common import add_threads_option, apply_threads_option, hf_generate_static
from transformers import AutoModelForCausalLM

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.course.noodle_corpus import SYSTEM_PROMPT, generate_documents, sample_prompts
from minilm_engine.course.experiments.toy_simulator import predicted_speedup
from minilm_engine.course.experiments.workloads import LengthMix, Workload, draw_output_lens, mixed_workload


def best_of(repeats: int, fn) -> float:
    return min(fn() for _ in range(repeats))


def timed_generate(llm: LLM, prompts, params) -> tuple[float, int]:
    """(CPU seconds, output tokens) of one `generate` call."""
    start = time.process_time()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.process_time() - start, sum(len(o.outputs[0].token_ids) for o in outs)


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


# 1 + 2 ---------------------------------------------------------------------------------------

def throughput(args) -> None:
    workload = mixed_workload(args.num_requests, seed=0)
    prompts, params = workload.prompts, workload.sampling_params
    useful = sum(p.max_tokens for p in params)
    static = BaselineLLM(strategy="static_batch", max_num_seqs=args.batch)
    # No step trace: it is for widgets and chapters, and static batching keeps none either.
    continuous = BaselineLLM(strategy="continuous", max_num_seqs=args.batch, record_trace=False)
    t_static, t_cont = alternate(args.repeats, lambda: timed_generate(static, prompts, params)[0],
                                 lambda: timed_generate(continuous, prompts, params)[0])
    hf_model = AutoModelForCausalLM.from_pretrained(continuous.model_path, dtype=torch.float32).eval()
    prompt_ids = [continuous.tokenizer.encode(p) for p in prompts]
    output_lens = [p.max_tokens for p in params]
    t_hf = best_of(args.repeats,
                   lambda: cpu_seconds(lambda: hf_generate_static(hf_model, prompt_ids, output_lens, args.batch)))
    print(f"workload: {len(prompts)} requests, {useful} output tokens "
          f"(max_tokens from {min(p.max_tokens for p in params)} to {max(p.max_tokens for p in params)}), "
          f"batch {args.batch}")
    for name, t in [("static batching", t_static), ("transformers.generate", t_hf), ("continuous", t_cont)]:
        print(f"  {name:<24} {t:7.2f} CPU s  {useful / t:8.0f} output tokens per CPU second")
    ceiling = predicted_speedup(output_lens, args.batch)
    print(f"1. continuous vs static batching:          {t_static / t_cont:5.2f}x throughput (goal >= 2.7x); "
          f"the toy's step counts allow {ceiling:.2f}x: the engine keeps {t_static / t_cont / ceiling:.0%}")
    step_cost(args, static, continuous)
    wide_spread(args)
    print(f"2. continuous vs transformers.generate:    {t_hf / t_cont:5.1f}x throughput (goal >= 3x)")


def alternate(repeats: int, first, second) -> tuple[float, float]:
    """Best of `repeats` of each, run in turns (a busy machine slows both alike)."""
    times = [(first(), second()) for _ in range(repeats)]
    return min(t[0] for t in times), min(t[1] for t in times)


def step_cost(args, static: LLM, continuous: LLM) -> None:
    """A step of each at the same number of running requests: `batch` requests that all want the
    same number of tokens take the same number of steps in both, so the time ratio is the
    ratio of one step's cost (prefill step included, as in serving)."""
    prompts = sample_prompts(args.batch, seed=11)
    params = SamplingParams(temperature=0, max_tokens=args.step_tokens, ignore_eos=True)
    t_static, t_cont = alternate(args.repeats, lambda: timed_generate(static, prompts, params)[0],
                                 lambda: timed_generate(continuous, prompts, params)[0])
    print(f"   a step at {args.batch} running requests ({args.step_tokens} steps each): continuous "
          f"{t_cont / args.step_tokens * 1e3:.2f} CPU ms, static {t_static / args.step_tokens * 1e3:.2f} CPU ms: "
          f"{t_cont / t_static:.2f}x the cost (goal <= 1.15x)")


def wide_spread(args) -> None:
    """32 requests on 8 seats, every eighth wanting 96 tokens and the rest 4 (a one-word answer):
    a static batch waits 96 steps for its one long request, continuous batching refills the
    other seats."""
    num_requests, seats = 32, 8
    lens = [96 if i % 8 == 0 else 4 for i in range(num_requests)]
    workload = Workload(sample_prompts(num_requests, seed=12),
                        [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens])
    static = BaselineLLM(strategy="static_batch", max_num_seqs=seats)
    continuous = BaselineLLM(strategy="continuous", max_num_seqs=seats, record_trace=False)
    t_static, t_cont = alternate(
        args.repeats, lambda: timed_generate(static, workload.prompts, workload.sampling_params)[0],
        lambda: timed_generate(continuous, workload.prompts, workload.sampling_params)[0])
    ceiling = predicted_speedup(lens, seats)
    print(f"   wider spread ({num_requests} requests, {seats} seats, every eighth 96 tokens, the rest 4): "
          f"continuous vs static {t_static / t_cont:.2f}x (goal >= 3x); the toy allows {ceiling:.2f}x: "
          f"the engine keeps {t_static / t_cont / ceiling:.0%}")


# 3 ---------------------------------------------------------------------------------------------

def capacity(args) -> None:
    """How many requests run at once in one KV budget; paged vs a max-length reservation."""
    block_size, num_blocks = 16, args.capacity_blocks
    # Realistic lengths for the memory question: a document as the prompt, a few hundred
    # tokens of answer (paging's waste is under one block per request, whatever its length).
    docs = [d for d in generate_documents(4 * args.capacity_requests, seed=1) if len(d) > 300]
    prompts = docs[: args.capacity_requests]
    params = LengthMix(short=(96, 192), long=(192, 320), long_fraction=0.5)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
              for n in draw_output_lens(len(prompts), seed=1, mix=params)]
    llm = BaselineLLM(strategy="continuous", num_kv_blocks=num_blocks, block_size=block_size,
              max_num_seqs=256, max_num_batched_tokens=4096)
    llm.generate(prompts, params, use_tqdm=False)
    records = llm.engine.trace.records
    peak = max(r.num_running for r in records)
    contiguous = num_blocks * block_size // llm.max_model_len
    # Waste while the pool is fullest: allocated slots not holding a token.
    busiest = max(records, key=lambda r: r.num_used_blocks)
    print(f"3. requests in one budget of {num_blocks * block_size} token slots: paged {peak} at once, "
          f"contiguous max-length ({llm.max_model_len} slots each) {contiguous}: "
          f"{peak / max(contiguous, 1):.1f}x (goal >= 4x)")
    waste = paged_waste(llm, busiest)
    print(f"   paged waste at the fullest step (step {busiest.step}, {busiest.num_used_blocks} blocks): "
          f"{waste:.1%} of allocated slots (goal <= 4%)")


def paged_waste(llm: LLM, record) -> float:
    """Share of allocated slots that hold no token, from the step's block tables."""
    allocated = sum(len(t) for t in record.block_tables.values()) * llm.engine.config.block_size
    return 1 - sum(record.tokens_in_cache.values()) / allocated


# 4 ---------------------------------------------------------------------------------------------

def prefix_ttft(args) -> None:
    menu = next(d for d in generate_documents(200, seed=3) if "menu" in d.lower()[:40])
    shared = SYSTEM_PROMPT + "\n\n" + menu + "\n"
    questions = sample_prompts(args.prefix_requests, seed=5)
    params = SamplingParams(temperature=0, max_tokens=1)

    llms = {caching: BaselineLLM(strategy="continuous", enable_prefix_caching=caching, max_num_seqs=1)
            for caching in (True, False)}

    def mean_ttft(caching: bool) -> float:
        llm = llms[caching]
        llm.generate(shared + "Order for table 1:\n", params, use_tqdm=False)  # warms the cache
        outs = llm.generate([shared + q for q in questions], params, use_tqdm=False)
        return sum(o.metrics.first_token_time - o.metrics.first_scheduled_time for o in outs) / len(outs)

    on = best_of(args.repeats, lambda: mean_ttft(True))
    off = best_of(args.repeats, lambda: mean_ttft(False))
    num_shared = len(llms[True].tokenizer.encode(shared))
    print(f"4. TTFT, {len(questions)} questions after a shared {num_shared}-token prefix: "
          f"caching off {off * 1e3:.1f} ms, on {on * 1e3:.1f} ms: {off / on:.1f}x faster (goal >= 5x)")


# 5 ---------------------------------------------------------------------------------------------

def prefill_stall(args) -> None:
    long_prompt = "\n".join(generate_documents(12, seed=7))
    short = sample_prompts(4, seed=8)

    def worst_gap(chunked: bool) -> float:
        llm = BaselineLLM(strategy="continuous", enable_chunked_prefill=chunked,
                  max_num_batched_tokens=64 if chunked else 1024, max_num_seqs=8)
        engine = llm.engine
        ids = llm.tokenizer.encode(long_prompt, verbose=False)[: 900]  # cut below: no length warning
        for i, p in enumerate(short):
            engine.add_request(f"s{i}", p, SamplingParams(temperature=0, max_tokens=args.stall_tokens, ignore_eos=True))
        for _ in range(5):
            engine.step()
        engine.add_request("long", {"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=4))
        streams = [engine.requests[f"s{i}"] for i in range(len(short))]
        while engine.has_unfinished_requests():
            engine.step()
        return max(max(r.metrics.inter_token_latencies) for r in streams)

    chunked = best_of(args.repeats, lambda: worst_gap(True))
    whole = best_of(args.repeats, lambda: worst_gap(False))
    print(f"5. worst inter-token gap while a 900-token prompt arrives: unchunked {whole * 1e3:.1f} ms, "
          f"chunked {chunked * 1e3:.1f} ms: {whole / chunked:.1f}x smaller (goal >= 4x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    parser.add_argument("--repeats", type=int, default=2)
    add_threads_option(parser)
    args = parser.parse_args()
    apply_threads_option(args)
    args.batch = 16
    args.num_requests = 16 if args.quick else 64
    args.capacity_blocks = 256 if args.quick else 512
    args.capacity_requests = 32 if args.quick else 96
    args.prefix_requests = 4 if args.quick else 8
    args.stall_tokens = 24 if args.quick else 48
    args.step_tokens = 16 if args.quick else 48
    if args.quick:
        args.repeats = 1
    print(f"machine: {platform.machine()} {platform.processor() or ''}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads\n")
    throughput(args)
    capacity(args)
    prefix_ttft(args)
    prefill_stall(args)


if __name__ == "__main__":
    main()
