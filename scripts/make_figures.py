"""Regenerate the figures of the README and the chapters from real measurements on the engine.

Every number comes from the package's own experiment functions (`minilm_engine.course.experiments`),
the same ones the notebooks run; this script only chooses sizes, calls them, prints what they
returned and draws it with matplotlib.  The shipped model noodle-chef runs on the CPU with one
torch thread (steadier timings on a shared machine), so the figures describe this machine:
each title says which.

    figure                              measured by
    figures/kv_cache_vs_recompute.png   kv_growth.compare_strategies
    figures/decode_step_vs_batch.png    batching.DecodeCostModel.measure, decode_sweep,
                                        engine_decode_sweep
    figures/static_vs_continuous.png    batching.compare_serving, toy_simulator.simulate
    figures/paged_vs_contiguous.png     memory.footprint_table, memory.waste_summary
    figures/chunked_prefill_stall.png   prefill.long_prompt_interference
    figures/technique_ladder.png        ledger.ladder.run_ladder (and its numbers in
                                        minilm_engine/course/ledger/measured/ladder_cpu.json)

    python scripts/make_figures.py                      # all six into figures/, 5-12 minutes
    python scripts/make_figures.py --quick              # smaller sizes, a smoke run (~20 s),
                                                        # written to a temporary folder
    python scripts/make_figures.py --only paged_vs_contiguous --out-dir /tmp/figs
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.course.noodle_corpus import sample_prompts
from minilm_engine.course.experiments import batching, kv_growth, memory, prefill
from minilm_engine.course.experiments.toy_simulator import simulate
from minilm_engine.course.experiments.workloads import LengthMix, mixed_workload
from minilm_engine.course.ledger import Ledger, Prices, ladder

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = "noodle-chef"
DEVICE = "cpu"
SIZE_IN = (10, 70 / 12)  # 1200 x 700 pixels at DPI
DPI = 120
# One colour per role, the same in every figure: the baseline red, the engine's way blue.
BASELINE, ENGINE, FLOOR, USED = "#CF222E", "#0969DA", "#6E7781", "#1F2328"


@dataclass(frozen=True)
class Sizes:
    """How big each experiment is: the full run makes the committed figures, --quick a smoke."""

    kv_lengths: list[int]
    kv_repeats: int
    batch_sizes: list[int]
    decode_steps: int
    decode_rounds: int
    num_seats: int
    num_requests: int
    length_mix: LengthMix
    serving_repeats: int
    num_footprint_requests: int
    num_streams: int
    num_stream_tokens: int
    inject_after_steps: int
    long_prompt_tokens: int
    interference_runs: int


FULL = Sizes(
    kv_lengths=[32, 64, 128, 256], kv_repeats=3,
    # A shared machine makes single timings jump by 2x: more rounds, keep each size's fastest.
    batch_sizes=[1, 2, 4, 8, 16, 32, 64], decode_steps=20, decode_rounds=6,
    num_seats=16, num_requests=64, length_mix=LengthMix(), serving_repeats=3,
    num_footprint_requests=48,
    num_streams=8, num_stream_tokens=80, inject_after_steps=20, long_prompt_tokens=900,
    interference_runs=5,
)
QUICK = Sizes(
    kv_lengths=[16, 32, 64], kv_repeats=1,
    batch_sizes=[1, 8, 32], decode_steps=4, decode_rounds=1,
    num_seats=8, num_requests=16, length_mix=LengthMix(short=(4, 12), long=(40, 56)),
    serving_repeats=1,
    num_footprint_requests=12,
    num_streams=4, num_stream_tokens=40, inject_after_steps=10, long_prompt_tokens=400,
    interference_runs=1,
)


# -- the machine and the page --------------------------------------------------------------


def cpu_name() -> str:
    """The CPU's model name (Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_line() -> str:
    """What every figure was measured on, for its title."""
    return (f"{MODEL} (fp32) on {cpu_name()}, {os.cpu_count()} cores, "
            f"{torch.get_num_threads()} torch thread")


def style() -> None:
    plt.rcParams.update({
        "figure.figsize": SIZE_IN, "figure.dpi": DPI, "savefig.dpi": DPI,
        "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
        "axes.spines.top": False, "axes.spines.right": False,
        "axes.grid": True, "grid.color": "#D0D7DE", "grid.linewidth": 0.6,
        "axes.axisbelow": True, "legend.frameon": False,
    })


def titled(fig, title: str) -> None:
    """A bold title over the figure, the hardware under it."""
    fig.suptitle(title, fontsize=13, fontweight="bold", y=0.975)
    fig.text(0.5, 0.915, hardware_line(), ha="center", fontsize=9.5, color=FLOOR)


def layout(fig, bottom: float = 0.0) -> None:
    """Fit the axes under the title and subtitle (and above a figure legend at `bottom`)."""
    fig.tight_layout(rect=(0, bottom, 1, 0.9))


def save(fig, out_dir: Path, name: str) -> Path:
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    print(f"  -> {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path} "
          f"({path.stat().st_size / 1024:.0f} KiB)")
    return path


# -- 1. KV cache vs recompute ------------------------------------------------------------------


def kv_cache_vs_recompute(sizes: Sizes, out_dir: Path) -> None:
    llms = {name: BaselineLLM(MODEL, device=DEVICE, strategy=name) for name in ("no_cache", "kv_cache")}
    prompt = sample_prompts(1, seed=0)[0]
    num_prompt = len(llms["kv_cache"].tokenizer.encode(prompt))
    for llm in llms.values():
        kv_growth.time_generation(llm, prompt, 8)  # warm-up
    rows = kv_growth.compare_strategies(llms, prompt, sizes.kv_lengths, sizes.kv_repeats)

    print(f"  prompt {prompt!r}: {num_prompt} tokens; fastest of {sizes.kv_repeats} runs")
    print(f"  {'new tokens':>10} {'no_cache s':>11} {'kv_cache s':>11} {'speed-up':>9} "
          f"{'token ratio':>12}")
    lengths = [row["num_new_tokens"] for row in rows]
    speedups = [row["no_cache"] / row["kv_cache"] for row in rows]
    for row, speedup in zip(rows, speedups):
        n = row["num_new_tokens"]
        ratio = (kv_growth.num_token_passes(num_prompt, n, cached=False)
                 / kv_growth.num_token_passes(num_prompt, n, cached=True))
        print(f"  {n:>10} {row['no_cache']:>11.3f} {row['kv_cache']:>11.3f} "
              f"{speedup:>8.1f}x {ratio:>11.1f}x")

    fig, ax = plt.subplots()
    ax.plot(lengths, [r["no_cache"] for r in rows], "o-", color=BASELINE, lw=2,
            label="no_cache: recompute the whole sequence every step")
    ax.plot(lengths, [r["kv_cache"] for r in rows], "o-", color=ENGINE, lw=2,
            label="kv_cache: keep keys and values, feed one token per step")
    for n, row, speedup in zip(lengths, rows, speedups):
        ax.annotate(f"kv_cache {speedup:.1f}x faster", (n, row["no_cache"]),
                    textcoords="offset points", xytext=(-8, 8), ha="right", fontsize=9.5,
                    color=BASELINE, fontweight="bold")
    ax.set_xticks(lengths)
    ax.set_xlim(0, max(lengths) * 1.05)
    ax.set_ylim(0, None)
    ax.set_xlabel(f"new tokens generated (greedy, after the same {num_prompt}-token prompt)")
    ax.set_ylabel("total generation time (s, fastest of the repeats)")
    ax.legend(loc="upper left")
    titled(fig, f"KV cache vs recompute: {speedups[-1]:.1f}x faster at {lengths[-1]} new tokens")
    layout(fig)
    save(fig, out_dir, "kv_cache_vs_recompute")


# -- 2. decode step vs batch size -------------------------------------------------------------


def decode_step_vs_batch(sizes: Sizes, out_dir: Path) -> None:
    max_batch = max(sizes.batch_sizes)
    # A KV pool for max_batch requests of up to 256 tokens each, as in chapter 01.
    llm = LLM(MODEL, device=DEVICE, max_num_seqs=max_batch, num_kv_blocks=max_batch * 256 // 16)
    # Bandwidth and FLOP/s are medians of a few runs; a busy neighbour only lowers them, so
    # measure three times and keep the best of each (else a step can land under its "floor").
    costs = [batching.DecodeCostModel.measure(llm.model, num_repeats=5) for _ in range(3)]
    cost = replace(costs[0], bandwidth=max(c.bandwidth for c in costs),
                   flops=max(c.flops for c in costs))
    model_t = batching.decode_sweep(llm.model, sizes.batch_sizes, num_steps=sizes.decode_steps,
                                    num_rounds=sizes.decode_rounds)
    engine_t = batching.engine_decode_sweep(llm, sizes.batch_sizes, num_steps=sizes.decode_steps,
                                            num_rounds=sizes.decode_rounds)

    print(f"  weights {cost.weight_bytes / 2**20:.1f} MiB ({cost.num_params / 1e6:.1f}M params), "
          f"copy bandwidth {cost.bandwidth / 1e9:.1f} GB/s, matmul {cost.flops / 1e9:.1f} GFLOP/s")
    print(f"  memory floor {cost.memory_floor_s(1) * 1e3:.2f} ms/step, "
          f"crossover batch B* = {cost.crossover_batch:.1f}")
    # Other programs on a shared machine take the core for whole milliseconds, which moves even
    # the median of a few ms steps by 2x; they only ever add time, so the figure draws each
    # batch size's fastest step (the medians are printed too).
    print(f"  {'batch':>5} | {'model step: median':>18} {'fastest':>8} {'tok/s':>6} | "
          f"{'engine step: median':>19} {'fastest':>8} {'tok/s':>6} | {'floor':>8}")
    for m, e in zip(model_t, engine_t):
        print(f"  {m.batch_size:>5} | {m.step_s * 1e3:15.2f} ms {m.min_step_s * 1e3:5.2f} ms "
              f"{m.batch_size / m.min_step_s:6.0f} | {e.step_s * 1e3:16.2f} ms "
              f"{e.min_step_s * 1e3:5.2f} ms {e.batch_size / e.min_step_s:6.0f} | "
              f"{cost.floor_s(m.batch_size) * 1e3:5.2f} ms")
    model_t = [replace(t, step_s=t.min_step_s) for t in model_t]
    engine_t = [replace(t, step_s=t.min_step_s) for t in engine_t]
    small, large = min(sizes.batch_sizes), max(sizes.batch_sizes)
    step_ratio, tps_ratio = batching.batching_gain(model_t, small, large)
    e_step_ratio, e_tps_ratio = batching.batching_gain(engine_t, small, large)
    print(f"  fastest steps, batch {large} vs {small}: model step {step_ratio:.1f}x longer, "
          f"{tps_ratio:.1f}x the tokens/s; engine step {e_step_ratio:.1f}x, {e_tps_ratio:.1f}x")

    batch = [t.batch_size for t in model_t]
    fig, (left, right) = plt.subplots(1, 2)
    left.plot(batch, [t.step_s * 1e3 for t in model_t], "o-", color=ENGINE, lw=2,
              label="model forward (contiguous cache)")
    left.plot(batch, [t.step_s * 1e3 for t in engine_t], "s-", color="#BF8700", lw=2,
              label="engine.step() (scheduler, paged cache, sampler)")
    left.plot(batch, [cost.memory_floor_s(b) * 1e3 for b in batch], "--", color=FLOOR,
              label=f"memory floor: weights / {cost.bandwidth / 1e9:.0f} GB/s")
    left.plot(batch, [cost.compute_floor_s(b) * 1e3 for b in batch], ":", color=FLOOR,
              label=f"compute floor: 2 x params x B / {cost.flops / 1e9:.0f} GFLOP/s")
    left.set_ylabel(f"one decode step (ms, fastest of "
                    f"{sizes.decode_steps} x {sizes.decode_rounds})")
    left.set_title("step time grows slowly with the batch")
    right.plot(batch, [t.tokens_per_s for t in model_t], "o-", color=ENGINE, lw=2)
    right.plot(batch, [t.tokens_per_s for t in engine_t], "s-", color="#BF8700", lw=2)
    right.plot(batch, [b / cost.floor_s(b) for b in batch], "--", color=FLOOR,
               label="tokens/s at the floor")
    right.set_ylabel("throughput (tokens/s)")
    right.set_title(f"tokens/s: x{tps_ratio:.0f} from batch {small} to {large} (model)")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        # Labels at 1, 2 and 5 of every decade, written as plain numbers.
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(batch, [str(b) for b in batch])
        ax.set_xlabel("batch size (requests decoding together)")
    handles, labels = left.get_legend_handles_labels()
    extra_h, extra_l = right.get_legend_handles_labels()
    fig.legend(handles + extra_h, labels + extra_l, loc="lower center", ncol=3, fontsize=9)
    titled(fig, f"One decode step vs batch size: batch {large} costs {step_ratio:.1f}x "
                f"batch {small}'s step time")
    layout(fig, bottom=0.1)
    save(fig, out_dir, "decode_step_vs_batch")


# -- 3. static vs continuous batching --------------------------------------------------------


def static_vs_continuous(sizes: Sizes, out_dir: Path) -> None:
    seats = sizes.num_seats
    workload = mixed_workload(sizes.num_requests, seed=0, mix=sizes.length_mix)
    llms = {
        "static": BaselineLLM(MODEL, device=DEVICE, strategy="static_batch", max_num_seqs=seats),
        "continuous": BaselineLLM(MODEL, device=DEVICE, strategy="continuous", max_num_seqs=seats,
                          num_kv_blocks=seats * 256 // 16),
    }
    batching.compare_serving(llms, workload[:4])  # warm-up
    runs = batching.compare_serving(llms, workload, num_repeats=sizes.serving_repeats)
    static_run, cont_run = runs["static"], runs["continuous"]
    ratio = cont_run.throughput / static_run.throughput
    sims = {name: simulate(run.output_lens, seats, name) for name, run in runs.items()}

    lens = workload.output_lens
    print(f"  {workload.num_requests} requests, {workload.num_output_tokens} output tokens "
          f"(lengths {min(lens)}-{max(lens)}), {seats} seats; fastest of {sizes.serving_repeats}")
    for name, run in runs.items():
        s = run.summary()
        print(f"  {name:>10}: {s['wall s']:6.2f} s, {s['tokens/s']:7.1f} tokens/s, "
              f"p50 latency {s['p50 latency s']:.2f} s, p99 {s['p99 latency s']:.2f} s, "
              f"{sims[name].num_steps} steps, {sims[name].utilization:.0%} of seat-steps useful")
    print(f"  continuous / static throughput: {ratio:.2f}x "
          f"(the real engine took {cont_run.num_steps} steps, "
          f"the toy {sims['continuous'].num_steps})")

    num_steps = max(sim.num_steps for sim in sims.values())
    fig, axes = plt.subplots(2, 1, sharex=True)
    for ax, (name, sim) in zip(axes, sims.items()):
        busy = sim.busy_seats_per_step()
        held = [0] * sim.num_steps  # seats held by a request that has already finished
        for finish, release in zip(sim.finish_steps, sim.release_steps):
            for step in range(finish, release):
                held[step] += 1
        steps = list(range(sim.num_steps))
        color = BASELINE if name == "static" else ENGINE
        ax.stackplot(steps, busy, held, step="post", colors=[color, "#D0D7DE"],
                     labels=["seats producing a token", "seats held by a finished request"])
        ax.axhline(seats, color=FLOOR, lw=0.8, ls="--")
        ax.set_xlim(0, num_steps)
        ax.set_ylim(0, seats * 1.05)
        ax.set_ylabel("seats (slots)")
        run = runs[name]
        ax.set_title(f"{name} batching: {sim.num_steps} steps, {sim.utilization:.0%} of seat-steps "
                     f"produce a token; measured {run.wall_s:.2f} s, {run.throughput:.0f} tokens/s",
                     loc="left")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2)
    axes[1].set_xlabel(f"step (one token per busy seat), replayed from the measured output lengths "
                       f"of {workload.num_requests} requests")
    titled(fig, f"Static vs continuous batching on {seats} seats: "
                f"{ratio:.1f}x the measured throughput")
    layout(fig, bottom=0.06)
    save(fig, out_dir, "static_vs_continuous")


# -- 4. paged vs contiguous KV memory ---------------------------------------------------------


def paged_vs_contiguous(sizes: Sizes, out_dir: Path) -> None:
    block_size, max_tokens = 16, 256
    llm = LLM(MODEL, device=DEVICE, max_num_seqs=64, num_kv_blocks=1024, block_size=block_size)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)  # stops at EOS, as in chapter 03
    outputs = llm.generate(sample_prompts(sizes.num_footprint_requests, seed=3), params,
                           use_tqdm=False)
    table = memory.footprint_table(outputs, params, block_size, llm.max_model_len)
    waste = memory.waste_summary(table)

    print(f"  {len(table)} requests, output tokens min {table.output_tokens.min()}, median "
          f"{table.output_tokens.median():.0f}, max {table.output_tokens.max()} "
          f"(max_tokens {max_tokens}, block_size {block_size}, max_model_len {llm.max_model_len})")
    print(f"  slots summed: tokens {table.tokens.sum()}, paged {table.paged_slots.sum()}, "
          f"contiguous prompt+max_tokens {table.reserved_max_tokens.sum()}, "
          f"contiguous max_model_len {table.reserved_max_model_len.sum()}")
    for scheme, share in waste.items():
        print(f"  {scheme:32s} {share:6.1%} of reserved slots never hold a token")

    table = table.sort_values("tokens").reset_index(drop=True)
    x = range(len(table))
    width = 0.4
    fig, ax = plt.subplots()
    for offset, column, color, _name in (
        (-width / 2, "reserved_max_tokens", BASELINE, "contiguous (prompt + max_tokens)"),
        (width / 2, "paged_slots", ENGINE, f"paged (blocks of {block_size})"),
    ):
        xs = [i + offset for i in x]
        ax.bar(xs, table[column], width, color=color, alpha=0.25, edgecolor=color, lw=0.4)
        ax.bar(xs, table["tokens"], width, color=color)
    ax.set_xlim(-0.7, len(table) - 0.3)
    ax.set_xticks([])
    ax.set_xlabel(f"{len(table)} requests (greedy, max_tokens {max_tokens}, stop at EOS), "
                  f"sorted by tokens stored (prompt + output)\na contiguous max_model_len "
                  f"reservation would hold {llm.max_model_len} slots each: "
                  f"{waste['contiguous, max_model_len']:.0%} unused")
    ax.set_ylabel("KV slots (tokens) per request")
    contiguous_waste = waste["contiguous, prompt + max_tokens"]
    legend = [
        Patch(color=BASELINE, label="contiguous: used"),
        Patch(facecolor=BASELINE, alpha=0.25, edgecolor=BASELINE,
              label=f"contiguous: reserved, never written ({contiguous_waste:.0%})"),
        Patch(color=ENGINE, label="paged: used"),
        Patch(facecolor=ENGINE, alpha=0.25, edgecolor=ENGINE,
              label=f"paged: empty tail of the last block ({waste['paged']:.0%})"),
    ]
    ax.legend(handles=legend, loc="upper left", ncol=2)
    ax.set_ylim(0, table.reserved_max_tokens.max() * 1.2)  # room for the legend
    titled(fig, f"KV slots per request: contiguous reservation leaves "
                f"{waste['contiguous, prompt + max_tokens']:.0%} unused, paging "
                f"{waste['paged']:.0%}")
    layout(fig)
    save(fig, out_dir, "paged_vs_contiguous")


# -- 5. chunked prefill vs a long prompt -------------------------------------------------------


def chunked_prefill_stall(sizes: Sizes, out_dir: Path) -> None:
    configs = {
        "chunked prefill, budget 64 tokens": {
            "enable_chunked_prefill": True, "max_num_batched_tokens": 64,
        },
        "no chunking, budget 1024 tokens": {
            "enable_chunked_prefill": False, "max_num_batched_tokens": 1024,
        },
    }
    stream_prompts = sample_prompts(sizes.num_streams, seed=1)
    results = []
    for label, engine_args in configs.items():
        llm = LLM(MODEL, device=DEVICE, max_model_len=1024, enable_prefix_caching=False,
                  num_kv_blocks=256, **engine_args)
        long_ids = prefill.corpus_token_ids(llm.tokenizer, sizes.long_prompt_tokens, seed=7)
        llm.generate(stream_prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        runs = []
        for _ in range(sizes.interference_runs):
            llm.engine.trace.clear()
            runs.append(prefill.long_prompt_interference(
                llm, stream_prompts, long_ids, sizes.num_stream_tokens, sizes.inject_after_steps,
                label=label))
        # Keep the run least disturbed by other programs, as chapter 04 does: the fastest in
        # total.  Its worst gap is a maximum, which one burst of other work can still set, so
        # every run's numbers are printed to show the spread.
        print(f"  {label}, every run: total (s) "
              f"{[round(float(r.steps.duration_s.sum()), 2) for r in runs]}, worst gap (ms) "
              f"{[round(r.worst_itl_s * 1e3) for r in runs]}, typical (ms) "
              f"{[round(r.baseline_itl_s * 1e3, 1) for r in runs]}")
        results.append(min(runs, key=lambda r: r.steps.duration_s.sum()))

    print(f"  {sizes.num_streams} streams of {sizes.num_stream_tokens} tokens; a "
          f"{sizes.long_prompt_tokens}-token prompt arrives after "
          f"{sizes.inject_after_steps} steps; the fastest of {sizes.interference_runs} runs")
    for r in results:
        print(f"  {r.label:>34}: typical gap {r.baseline_itl_s * 1e3:6.1f} ms, worst after "
              f"arrival {r.worst_itl_s * 1e3:6.1f} ms ({r.stall_ratio:.1f}x), long prompt TTFT "
              f"{r.long_ttft_s * 1e3:6.1f} ms, "
              f"{int((r.steps.num_prefill_tokens > 0).sum())} steps with prefill")

    top = 1.15e3 * max(r.worst_itl_s for r in results)
    fig, axes = plt.subplots(len(results), 1, sharex=True)
    for ax, r, color in zip(axes, results, (ENGINE, BASELINE)):
        for _, group in r.itl.groupby("request_id", sort=False):
            # Each gap is a segment as long as it lasted, drawn at the height of its length.
            for t, gap in zip(group["time_s"], group["itl_s"]):
                ax.plot([t - gap, t], [gap * 1e3, gap * 1e3], color=color, lw=1.6, alpha=0.55)
        ax.axvline(0, color=USED, ls="--", lw=1)
        ax.axvspan(0, r.long_ttft_s, color="#BF8700", alpha=0.12, lw=0,
                   label="the long prompt is being prefilled (until its first token)")
        ax.set_ylabel("inter-token gap (ms)")
        ax.set_ylim(0, top)
        ax.set_title(f"{r.label}: worst gap {r.worst_itl_s * 1e3:.0f} ms = {r.stall_ratio:.1f}x "
                     f"the typical {r.baseline_itl_s * 1e3:.0f} ms; long prompt's TTFT "
                     f"{r.long_ttft_s * 1e3:.0f} ms", loc="left")
    for ax in axes:
        ax.annotate(f"{results[0].num_long_prompt_tokens}-token prompt arrives", (0, 1),
                    xycoords=("data", "axes fraction"), xytext=(4, -4), ha="left", va="top",
                    textcoords="offset points", fontsize=9)
    axes[0].legend(loc="upper right")
    axes[-1].set_xlabel("time since the long prompt arrived (s); each segment is one wait "
                        f"between two tokens of one of {sizes.num_streams} streaming requests")
    unchunked = results[1]
    titled(fig, f"A long prompt stalls streaming requests {unchunked.stall_ratio:.0f}x without "
                f"chunking, {results[0].stall_ratio:.1f}x with chunked prefill")
    layout(fig)
    save(fig, out_dir, "chunked_prefill_stall")


# -- 6. the technique ladder (chapter 08) ------------------------------------------------------

# A small cloud machine with 2 vCPUs rents for about this much; only ratios are compared with
# the seed's claims, so the reference price sets the scale of the cost panel and nothing else.
LADDER_PRICE = Prices(gpu_cost_per_hour=0.10, currency="$")
LADDER_JSON = REPO_ROOT / "minilm_engine" / "ledger" / "measured" / "ladder_cpu.json"


def technique_ladder(sizes: Sizes, out_dir: Path) -> None:
    quick = sizes is QUICK
    workload = ladder.ladder_workload(
        4 if quick else 16, seed=0,
        mix=LengthMix(short=(4, 8), long=(16, 24)) if quick else ladder.LADDER_MIX)
    results = ladder.run_ladder(workload, model=MODEL, device=DEVICE, max_num_seqs=8,
                                num_repeats=1 if quick else 2, progress=True)
    table = ladder.ladder_table(results, LADDER_PRICE)
    print(f"  {workload.num_requests} requests behind a shared system prompt, "
          f"{workload.num_output_tokens} output tokens, 8 seats")
    print(table.drop(columns=["adds"]).round(3).to_string())
    for v in ladder.verdicts(results, LADDER_PRICE):
        print(f"  {v.claim}: {v.verdict} ({v.measured})")
    json_path = LADDER_JSON if out_dir == REPO_ROOT / "figures" else out_dir / "ladder_cpu.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(ladder.results_to_json(results), indent=1) + "\n")
    print(f"  -> {json_path.relative_to(REPO_ROOT) if json_path.is_relative_to(REPO_ROOT) else json_path}")

    names = [r.rung.name for r in results]
    fig, (ax_tps, ax_cost) = plt.subplots(1, 2)
    x = range(len(results))
    measured = [r.measurement for r in results]
    tps = [m.output_tokens_per_s if m else 0 for m in measured]
    costs = [ladder_cost(m) if m else 0 for m in measured]
    colors = [BASELINE if i < 2 else ENGINE for i in x]
    ax_tps.bar(x, tps, color=colors)
    ax_cost.bar(x, costs, color=colors)
    first_cost = next(c for c in costs if c)
    ax_cost.axhline(first_cost / 3, color=FLOOR, ls="--", lw=1)
    ax_cost.text(0.45, first_cost / 3, " the seed's 30 -> 10 per Mtok: 3x cheaper than the start",
                 ha="left", va="bottom", fontsize=8.5, color=FLOOR)
    for ax, values, fmt in ((ax_tps, tps, "{:,.0f}"), (ax_cost, costs, "${:.2f}")):
        top = max(values)
        for i, (r, v) in enumerate(zip(results, values)):
            if r.available:
                ax.text(i, v + top * 0.01, fmt.format(v), ha="center", va="bottom", fontsize=8.5)
            else:
                ax.bar(i, top * 0.12, color="none", edgecolor=FLOOR, hatch="//", lw=0.8)
                ax.text(i, top * 0.14, "not in\nthis\nversion", ha="center", va="bottom",
                        fontsize=8, color=FLOOR)
        ax.set_xticks(list(x), names, rotation=30, ha="right")
    ax_tps.set_ylabel("output tokens / s")
    ax_tps.set_title("throughput, same workload on every rung", loc="left")
    ax_cost.set_ylabel(f"{LADDER_PRICE.currency} per million output tokens")
    ax_cost.set_title(f"cost at {LADDER_PRICE.money(LADDER_PRICE.gpu_cost_per_hour)}/h "
                      "for this machine", loc="left")
    best = max(tps)
    titled(fig, f"The technique ladder: {tps[0]:,.0f} -> {best:,.0f} output tokens/s "
                f"({best / tps[0]:.0f}x), {workload.num_requests} requests, 8 seats")
    layout(fig)
    save(fig, out_dir, "technique_ladder")


def ladder_cost(measurement) -> float:
    return Ledger(measurement, LADDER_PRICE).blended_cost_per_mtok


FIGURES = {
    "kv_cache_vs_recompute": kv_cache_vs_recompute,
    "decode_step_vs_batch": decode_step_vs_batch,
    "static_vs_continuous": static_vs_continuous,
    "paged_vs_contiguous": paged_vs_contiguous,
    "chunked_prefill_stall": chunked_prefill_stall,
    "technique_ladder": technique_ladder,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes: a smoke run")
    parser.add_argument("--only", choices=sorted(FIGURES), action="append",
                        help="make only this figure (repeatable)")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="where to write the PNGs (default: figures/, or with --quick a "
                             "temporary folder, so a smoke run never replaces the real figures)")
    args = parser.parse_args()

    torch.set_num_threads(1)  # tiny model: one thread gives the steadiest timings
    torch.manual_seed(0)
    style()
    sizes = QUICK if args.quick else FULL
    if args.out_dir is None:
        quick_dir = Path(tempfile.gettempdir()) / "minilm_engine_figures_quick"
        args.out_dir = quick_dir if args.quick else REPO_ROOT / "figures"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"{datetime.date.today()} | {hardware_line()}")
    print(f"{batching.hardware_summary(DEVICE)} | {'quick' if args.quick else 'full'} sizes")
    total = time.perf_counter()
    for name in args.only or FIGURES:
        start = time.perf_counter()
        print(f"\n[{name}]")
        FIGURES[name](sizes, args.out_dir)
        print(f"  ({time.perf_counter() - start:.0f} s)")
    print(f"\ndone in {time.perf_counter() - total:.0f} s")


if __name__ == "__main__":
    main()
