"""Interview drills: questions with model answers, numeric ones computed for real model shapes.

Contract: every chapter keeps its questions in `drills/NN_topic.json`, and `load_drills()` reads
every JSON file there (so a new chapter's bank joins chapter 09 by being added).  An item is

    {"question", "answer",                         required
     "chapter": "02",                              default: the file's number
     "kind": "concept" | "numeric" | "what-if" | "debug",   default "concept"
     "difficulty": 1 | 2 | 3,                      default 2
     "link": "02_kv_cache.ipynb#Experiment 3: what the cache costs in memory",
                                                   the cell that measures it: a notebook and
                                                   one of its markdown headings (default: the
                                                   chapter's notebook, its "Interview drill")
     "compute": {"formula": "kv_gib", "model": "Meta-Llama-3-8B", ...},   numeric only
     "unit": "GiB", "tolerance": 0.05}             numeric only: relative tolerance

A numeric item's value is computed at load time by `FORMULAS[formula](**params)` from the
shapes in `course/known_configs.py` (never typed in); `{value}` and the params may appear in
the question and answer, e.g. "{value:.1f}".  `Drill.check(text)` grades a numeric answer.
`show_drills` renders answers folded under questions; `export_markdown` writes the whole bank.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minilm_engine.course.known_configs import known_config
from minilm_engine.course.teaching import drill_math as dm
from minilm_engine.course.teaching import serving_math as sm
from minilm_engine.course.teaching.serving_math import LINKS

DRILLS_DIR = Path(__file__).parent / "drills"
KINDS = ("concept", "numeric", "what-if", "debug")
GiB = 1 << 30

# Datasheet rates the numeric questions assume (bf16/fp16 dense tensor FLOP/s, memory bandwidth),
# quoted, not measured here:
#   H100 SXM5: 989 TFLOP/s, 3.35 TB/s  https://glennklockwood.com/garden/processors/h100 (NVIDIA, 2022)
#   A100 80GB: 312 TFLOP/s, 2.0 TB/s   https://glennklockwood.com/garden/processors/A100 (NVIDIA, 2020)
#   L4: 242 sparse = 121 dense, 300 GB/s  https://grokipedia.com/page/NVIDIA_L4_vs_L40S (NVIDIA, 2023)
#   T4: 65 TFLOP/s fp16, 320 GB/s       https://sysrqmts.com/gpus/compare/nvidia-a100-sxm4-40-gb-vs-nvidia-tesla-t4 (2018)
#   H100 SXM5 FP8 dense: 1,979 TFLOP/s ("3,958 TFLOPS*, *with sparsity, 1/2 lower without",
#       NVIDIA's datasheet as reproduced at https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html;
#       1978.9 in https://glennklockwood.com/garden/processors/h100) (NVIDIA, 2022)
# Interconnects are `serving_math.LINKS`.
GPUS = {
    "H100": {"flops": 989e12, "bandwidth": 3.35e12, "memory_gib": 80, "fp8_flops": 1979e12},
    "A100": {"flops": 312e12, "bandwidth": 2.0e12, "memory_gib": 80},
    "L4": {"flops": 121e12, "bandwidth": 0.3e12, "memory_gib": 24},
    "T4": {"flops": 65e12, "bandwidth": 0.32e12, "memory_gib": 16},
}


def _kv_bytes(model: str, bytes_per_element: int = 2) -> int:
    return known_config(model).kv_bytes_per_token(bytes_per_element)


def _weight_bytes(model: str, bytes_per_element: float = 2) -> float:
    return known_config(model).num_parameters() * bytes_per_element


def _cost_model(model: str, gpu: str, bytes_per_element: int = 2):
    from minilm_engine.course.experiments.batching import DecodeCostModel

    rates = GPUS[gpu]
    return DecodeCostModel.for_shapes(known_config(model), rates["bandwidth"], rates["flops"], bytes_per_element)


def _step_time_ms(model: str, gpu: str, batch: int, context: int, bytes_per_element: int = 2) -> float:
    """Chapter 01's decode step model: max(weights + batch x context x KV bytes, FLOPs) / rates."""
    return 1e3 * _cost_model(model, gpu, bytes_per_element).floor_s(batch, context)


def _context_per_request(model: str, memory_gb: float, concurrency: int, utilization: float, block_size: int) -> int:
    """Chapter 10's context limit: the KV pool left after the weights (bf16), in whole blocks,
    shared by `concurrency` requests, capped by the architecture (kv_cache.sizing's rule)."""
    from minilm_engine.core.kv_cache_sizing import max_context_len

    config = known_config(model)
    per_block = block_size * _kv_bytes(model)
    num_blocks = int((utilization * memory_gb * 1e9 - _weight_bytes(model)) // per_block)
    return max_context_len(num_blocks, block_size, concurrency, config.max_position_embeddings)


def _attention_crossover(model: str, causal: bool) -> float:
    """Chapter 04's T*: the prompt length where attention's FLOPs equal the linear layers'."""
    from minilm_engine.course.experiments.prefill import attention_crossover_tokens

    return attention_crossover_tokens(known_config(model), causal)


def _matmul_parameters(model: str) -> int:
    """Chapter 04's P: the weights each prompt token is multiplied by (no embedding, no LM head)."""
    from minilm_engine.course.experiments.prefill import matmul_parameters

    return matmul_parameters(known_config(model))


def _flops(gpu: str, precision: str = "bf16") -> float:
    return GPUS[gpu]["fp8_flops"] if precision == "fp8" else GPUS[gpu]["flops"]


def _max_sequences_tp(model: str, gpu: str, tp: int, context: int, utilization: float = 0.9) -> int:
    """Sequences of `context` tokens a tensor-parallel group holds: the group's memory budget less
    one copy of the weights (sharded, not replicated), over the KV of one sequence (KV heads are
    sharded too, so the pool is the group's)."""
    free = utilization * GPUS[gpu]["memory_gib"] * GiB * tp - _weight_bytes(model)
    return max(0, int(free // (context * _kv_bytes(model))))


def _w4a16_speedup(gpu: str, batch: int, group_size: int = 128) -> float:
    """Roofline ratio of a bf16 GEMM's time to a W4A16 (Marlin-class) GEMM's at this batch."""
    flops, bandwidth = GPUS[gpu]["flops"], GPUS[gpu]["bandwidth"]
    w4 = sm.bytes_per_weight(4, group_size)
    return sm.gemm_time_per_weight(batch, 2, flops, bandwidth) / sm.gemm_time_per_weight(batch, w4, flops, bandwidth)


def _spec_best_k(alpha: float, draft_cost: float, max_k: int = 16) -> int:
    """The K in 1..max_k with the highest predicted speed-up (verification costs one step)."""
    return max(range(1, max_k + 1), key=lambda k: FORMULAS["spec_speedup"](alpha, k, draft_cost))


def _spec_break_even_alpha(k: int, draft_cost: float) -> float:
    """The acceptance rate where speculation's predicted speed-up is exactly 1 (bisection: the
    speed-up grows with alpha)."""
    lo, hi = 0.0, 1 - 1e-9
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if FORMULAS["spec_speedup"](mid, k, draft_cost) < 1 else (lo, mid)
    return (lo + hi) / 2


def _prefix_hit_pct(replicas: int, requests: int, routing: str) -> float:
    """Share of `requests` sharing one prefix that find it cached: each replica the prefix lands
    on computes it once (random routing spreads it; prefix-aware routing sends all to one)."""
    copies = sm.expected_distinct(replicas, requests) if routing == "random" else 1
    return 100 * (1 - copies / requests)


def _lora_mib(model: str, rank: int, modules: list[str], bytes_per_element: int = 2) -> float:
    return sm.lora_parameters(known_config(model), rank, modules) * bytes_per_element / (1 << 20)


FORMULAS: dict[str, Callable[..., float]] = {
    "kv_kib_per_token": lambda model, bytes_per_element=2: _kv_bytes(model, bytes_per_element) / 1024,
    "kv_gib": lambda model, tokens, bytes_per_element=2: tokens * _kv_bytes(model, bytes_per_element) / GiB,
    "weights_gib": lambda model, bytes_per_element=2: _weight_bytes(model, bytes_per_element) / GiB,
    "parameters_b": lambda model: known_config(model).num_parameters() / 1e9,
    "max_sequences": lambda model, memory_gib, context, bytes_per_element=2: max(
        0, (memory_gib * GiB - _weight_bytes(model, bytes_per_element)) // (context * _kv_bytes(model, bytes_per_element))
    ),
    "kv_over_weights": lambda model, batch, context, bytes_per_element=2: (
        batch * context * _kv_bytes(model, bytes_per_element) / _weight_bytes(model, bytes_per_element)
    ),
    "weights_floor_ms": lambda model, gpu, bytes_per_element=2, tp=1: (
        1e3 * _weight_bytes(model, bytes_per_element) / tp / GPUS[gpu]["bandwidth"]
    ),
    "step_time_ms": _step_time_ms,
    "step_ratio": lambda model, gpu, batch, context: _cost_model(model, gpu).slowdown(batch, context),
    "batch_at_2x": lambda model, gpu, context: _cost_model(model, gpu).batch_at_slowdown(context, 2.0),
    "crossover_batch": lambda gpu, bytes_per_element=2, precision="bf16": (
        _flops(gpu, precision) / GPUS[gpu]["bandwidth"] * bytes_per_element / 2
    ),
    "prefill_tflops": lambda model, tokens: 2 * _matmul_parameters(model) * tokens / 1e12,
    "quadratic_crossover_tokens": lambda model, causal=True: _attention_crossover(model, causal),
    "matvec_flops_per_byte": lambda bytes_per_element=2: 2 / bytes_per_element,
    "tokens_per_round": lambda alpha, k: (1 - alpha ** (k + 1)) / (1 - alpha),
    "spec_speedup": lambda alpha, k, draft_cost, verify_cost=1.0: (
        (1 - alpha ** (k + 1)) / (1 - alpha) / (k * draft_cost + verify_cost)
    ),
    "concurrency": lambda rate_per_s, latency_s: rate_per_s * latency_s,
    "cost_per_million_busy": lambda price_per_hour, tokens_per_second, utilization: (
        price_per_hour / utilization / (tokens_per_second * 3600) * 1e6
    ),
    "gqa_ratio": lambda model: known_config(model).num_attention_heads / known_config(model).num_key_value_heads,
    "blocks": lambda tokens, block_size: math.ceil(tokens / block_size),
    "cost_per_million": lambda price_per_hour, tokens_per_second: price_per_hour / (tokens_per_second * 3600) * 1e6,
    # chapter 10
    "context_per_request": lambda model, memory_gb, concurrency, utilization=0.9, block_size=16: (
        _context_per_request(model, memory_gb, concurrency, utilization, block_size)
    ),
    "retry_after_s": lambda limit_per_minute, level, amount: (amount - level) / (limit_per_minute / 60),
    "batch_discount_pct": lambda interactive_tokens_per_s, with_backlog_tokens_per_s: (
        100 * (1 - interactive_tokens_per_s / with_backlog_tokens_per_s)
    ),
    "kv_transfer_ms": lambda model, tokens, link_gb_per_s, bytes_per_element=2: (
        1e3 * tokens * _kv_bytes(model, bytes_per_element) / (link_gb_per_s * 1e9)
    ),
    # parallelism (chapter 09)
    "ring_allreduce_ms": lambda gib, num_gpus, link: 1e3 * sm.ring_allreduce_s(gib * GiB, num_gpus, LINKS[link]),
    # two all-reduces of (batch, hidden) per layer; the ring time is linear in bytes, so sum them
    "tp_allreduce_ms_per_step": lambda model, batch, tp, link: 1e3 * known_config(model).num_hidden_layers * (
        sm.ring_allreduce_s(sm.tp_allreduce_bytes_per_layer(known_config(model), batch), tp, LINKS[link])
    ),
    "weights_gib_per_gpu": lambda model, tp, bytes_per_element=2: _weight_bytes(model, bytes_per_element) / tp / GiB,
    "max_sequences_tp": _max_sequences_tp,
    "pipeline_bubble_pct": lambda stages, microbatches: 100 * sm.pipeline_bubble_fraction(stages, microbatches),
    "pp_send_ms": lambda model, tokens, link: 1e3 * tokens * known_config(model).hidden_size * 2 / LINKS[link],
    "weights_load_s": lambda model, link: _weight_bytes(model) / LINKS[link],
    # mixture of experts
    "moe_parameters_b": lambda moe, which: sm.moe_parameters(moe)[which] / 1e9,
    "moe_weights_gib": lambda moe, bytes_per_element=2: sm.moe_parameters(moe)["total"] * bytes_per_element / GiB,
    "experts_touched": lambda moe, batch: sm.expected_distinct(
        sm.MOE_SHAPES[moe]["num_experts"], batch, sm.MOE_SHAPES[moe]["top_k"]
    ),
    "moe_step_read_gib": lambda moe, batch, bytes_per_element=2: (
        sm.moe_bytes_read_per_step(moe, batch, bytes_per_element) / GiB
    ),
    "ep_all_to_all_mb": lambda moe, tokens: sm.ep_all_to_all_bytes(moe, tokens) / 1e6,
    # low-bit GEMMs (chapter 06)
    "w4a16_crossover_batch": lambda gpu, group_size=128: (
        GPUS[gpu]["flops"] / GPUS[gpu]["bandwidth"] * sm.bytes_per_weight(4, group_size) / 2
    ),
    "w4a16_speedup": _w4a16_speedup,
    "smoothquant_scale": lambda act_max, weight_max, alpha=0.5: sm.smoothquant_scale(act_max, weight_max, alpha),
    "smoothed_act_max": lambda act_max, weight_max, alpha=0.5: act_max / sm.smoothquant_scale(act_max, weight_max, alpha),
    "int8_step": lambda max_abs: max_abs / 127,
    "fp8_scale": lambda amax: amax / sm.FP8_E4M3_MAX,
    # speculation (chapter 05)
    "spec_best_k": _spec_best_k,
    "spec_break_even_alpha": _spec_break_even_alpha,
    "tree_tokens_per_step": lambda alpha, widths: sm.tree_tokens_per_step(alpha, widths),
    "tree_num_nodes": lambda widths: sm.tree_num_nodes(widths),
    "tree_speedup": lambda alpha, widths, draft_cost, verify_cost=1.0: (
        sm.tree_tokens_per_step(alpha, widths) / (len(widths) * draft_cost + verify_cost)
    ),
    # numerics, load, utilization, routing, adapters
    "bf16_spacing": lambda x: sm.bf16_spacing(x),
    "littles_concurrency": lambda rate_per_s, ttft_s, output_tokens, tpot_ms: (
        rate_per_s * (ttft_s + output_tokens * tpot_ms / 1e3)
    ),
    "littles_kv_gib": lambda model, rate_per_s, ttft_s, output_tokens, tpot_ms, prompt_tokens: (
        rate_per_s * (ttft_s + output_tokens * tpot_ms / 1e3) * (prompt_tokens + output_tokens) * _kv_bytes(model) / GiB
    ),
    "mbu_pct": lambda model, gpu, tpot_ms, batch, context: (
        100 * (_weight_bytes(model) + batch * context * _kv_bytes(model)) / (tpot_ms / 1e3) / GPUS[gpu]["bandwidth"]
    ),
    "mfu_pct": lambda model, gpu, tokens_per_s: 100 * 2 * known_config(model).num_parameters() * tokens_per_s / GPUS[gpu]["flops"],
    "prefix_hit_pct": _prefix_hit_pct,
    "replicas_for_load": lambda rate_per_s, output_tokens, replica_tokens_per_s, target_utilization: math.ceil(
        rate_per_s * output_tokens / (replica_tokens_per_s * target_utilization)
    ),
    "lora_mib": _lora_mib,
    "adapters_in_budget": lambda model, rank, modules, budget_gib: (budget_gib * 1024) // _lora_mib(model, rank, modules),
    "lora_flops_pct": lambda model, rank, modules: 100 * sm.lora_flops_fraction(known_config(model), rank, modules),
    "lora_step_overhead_pct": lambda model, rank, modules, distinct_adapters: (
        100 * distinct_adapters * _lora_mib(model, rank, modules) * (1 << 20) / _weight_bytes(model)
    ),
    # queueing, sampling, formats, capacity (drill_math.py)
    "mmc_wait_ms": lambda rate_per_s, service_s, servers: 1e3 * dm.mmc_wait_s(rate_per_s, service_s, servers),
    "mmc_utilization_pct": lambda rate_per_s, service_s, servers: 100 * rate_per_s * service_s / servers,
    "mmc_max_rate": dm.mmc_max_rate,
    "tail_samples": dm.tail_samples,
    "max_exceeds_pct": dm.max_exceeds_pct,
    "scaled_bits": dm.scaled_bits,
    "accuracy_ci_pts": dm.accuracy_ci_pts,
    "spot_cost": dm.spot_cost,
    "open_loop_delayed": lambda stall_s, interval_ms: stall_s * 1e3 / interval_ms,
}


@dataclass(frozen=True)
class Drill:
    chapter: str
    question: str
    answer: str
    kind: str = "concept"
    difficulty: int = 2
    link: str = ""  # "NN_topic.ipynb#Heading"
    value: float | None = None  # numeric drills: the expected number
    unit: str = ""
    tolerance: float = 0.05  # relative
    source: str = field(default="", compare=False)  # the JSON file it came from

    def check(self, text: str | float) -> bool | None:
        """A numeric answer within the tolerance? None for a drill without a number."""
        if self.value is None:
            return None
        number = parse_number(text)
        if number is None:
            return False
        return math.isclose(number, self.value, rel_tol=self.tolerance, abs_tol=1e-12)

    @property
    def notebook(self) -> str:
        return self.link.partition("#")[0]

    @property
    def heading(self) -> str:
        return self.link.partition("#")[2]

    def link_markdown(self, prefix: str = "") -> str:
        """A Markdown link to the measuring cell (Jupyter's heading anchors: spaces -> '-')."""
        anchor = self.heading.replace(" ", "-")
        return f"[{self.notebook} · {self.heading}]({prefix}{self.notebook}#{anchor})"


def parse_number(text: str | float) -> float | None:
    """'1,024', '12.5 GiB', '3e9', '~40' -> a float; None if there is no number."""
    if isinstance(text, (int, float)):
        return float(text)
    match = re.search(r"[-+]?\d[\d,_]*(?:\.\d+)?(?:[eE][-+]?\d+)?", str(text))
    return float(match.group().replace(",", "").replace("_", "")) if match else None


def _chapter_notebooks() -> dict[str, str]:
    """Chapter number -> notebook name: a bank `NN_topic.json` belongs to `NN_topic.ipynb`."""
    return {path.stem.split("_")[0]: f"{path.stem}.ipynb" for path in DRILLS_DIR.glob("*.json")}


def _build(item: dict[str, Any], number: str, source: str, notebooks: dict[str, str]) -> Drill:
    chapter = str(item.get("chapter", number))
    kind = item.get("kind", "numeric" if "compute" in item else "concept")
    if kind not in KINDS:
        raise ValueError(f"{source}: kind must be one of {KINDS}, got {kind!r}")
    question, answer, value = item["question"], item["answer"], None
    if "compute" in item:
        params = dict(item["compute"])
        formula = params.pop("formula")
        if formula not in FORMULAS:
            raise ValueError(f"{source}: unknown formula {formula!r}; known: {sorted(FORMULAS)}")
        value = float(FORMULAS[formula](**params))
        question = question.format(value=value, **params)
        answer = answer.format(value=value, **params)
    link = item.get("link") or f"{notebooks.get(chapter, chapter)}#Interview drill"
    return Drill(
        chapter, question, answer, kind, int(item.get("difficulty", 2)), link, value,
        item.get("unit", ""), float(item.get("tolerance", 0.05)), source,
    )


def load_drills(
    chapter: str | None = None, kind: str | None = None, difficulty: int | None = None
) -> list[Drill]:
    """Every drill of the bank (or of one chapter, kind, difficulty), in file order."""
    notebooks = _chapter_notebooks()
    drills = []
    for file in sorted(DRILLS_DIR.glob("*.json")):
        number = file.stem.split("_")[0]
        for item in json.loads(file.read_text()):
            drill = _build(item, number, file.name, notebooks)
            if chapter is not None and drill.chapter != chapter:
                continue
            if kind is not None and drill.kind != kind:
                continue
            if difficulty is not None and drill.difficulty != difficulty:
                continue
            drills.append(drill)
    return drills


def show_drills(chapter: str | None = None):
    """The chapter's questions, each answer folded under its question (a static frontend, e.g.
    GitHub, shows them unfolded: that is the 'prints questions and answers' fallback)."""
    from IPython.display import HTML

    parts = []
    for i, d in enumerate(load_drills(chapter), 1):
        parts.append(
            f"<p><b>Q{i}. {html.escape(d.question)}</b></p>"
            f"<details><summary>Model answer</summary><p>{html.escape(d.answer)}</p></details>"
        )
    return HTML("\n".join(parts))


def export_markdown(path: str | Path | None = None, drills: list[Drill] | None = None) -> str:
    """The whole bank as one Markdown file (questions, model answers, links), for reading
    offline; written to `path` when given.  Links are relative to notebooks/."""
    drills = load_drills() if drills is None else drills
    lines = ["# Interview drills: the whole bank", "",
             f"{len(drills)} questions from the minilm-engine chapters. Numeric answers are computed "
             "by the package for the models' published shapes.", ""]
    by_chapter: dict[str, list[Drill]] = {}
    for d in drills:
        by_chapter.setdefault(d.chapter, []).append(d)
    for chapter in sorted(by_chapter):
        lines += [f"## Chapter {chapter}", ""]
        for i, d in enumerate(by_chapter[chapter], 1):
            lines += [f"### {chapter}.{i} ({d.kind}, difficulty {d.difficulty})", "", d.question, "",
                      f"**Model answer.** {d.answer}", "", f"Measured in: {d.link_markdown()}", ""]
    text = "\n".join(lines)
    if path is not None:
        Path(path).write_text(text)
    return text


def show_topic(heading: str | None = None, chapter: str | None = None, kind: str | None = None,
               limit: int | None = None):
    """A few drills, answers folded: those that link to chapter 09's section `heading`, or those
    of `chapter` (and `kind`), at most `limit`."""
    from IPython.display import HTML

    drills = load_drills(chapter, kind)
    if heading is not None:
        drills = [d for d in drills if d.heading == heading]
    parts = [f"<p><b>[{d.chapter} · {d.kind} · difficulty {d.difficulty}] {html.escape(d.question)}</b></p>"
             f"<details><summary>Model answer</summary><p>{html.escape(d.answer)}</p></details>"
             for d in drills[:limit]]
    return HTML("\n".join(parts))
