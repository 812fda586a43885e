"""Service tiers measured on the engine: what a batch backlog does to interactive latency, under
FCFS and under priority scheduling, and how fast the backlog itself is served.

Contract: `run_tier_workload(llm, workload, with_backlog)` drives one `LLMEngine` step by step:
interactive requests arrive by a Poisson clock (seeded), the batch backlog (if any) is all
queued at time 0 at the batch tier's priority (`BATCH_PRIORITY` under "priority"; 0 under
"fcfs", which refuses other priorities).  It returns a `TierRun`: each interactive request's
TTFT (from its scheduled arrival, as its client would see it) and its gaps between tokens, and
the backlog's output tokens and makespan.  `measure_tiers(...)` runs the four conditions

    fcfs      alone    interactive traffic only
    fcfs      backlog  + the backlog, everyone in arrival order: interactive waits behind it
    priority  alone    (the same as fcfs: every request has priority 0)
    priority  backlog  + the backlog at the batch tier: it gets what interactive work leaves

`num_repeats` times, rotating which goes first (a shared machine drifts), and
`tiers_table(result)` gives P50/P99 of TTFT and ITL and the backlog's tokens/s as the median
over repeats with [min-max].  `ledger.tiers` turns the measured throughputs into the batch
tier's price.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

import pandas as pd

from minilm_engine.bench.datasets import noodle_requests
from minilm_engine.entrypoints.openai.serving import SERVICE_TIER_PRIORITY
from minilm_engine.entrypoints.llm import LLM
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.experiments.batching import percentile

BATCH_PRIORITY = SERVICE_TIER_PRIORITY["flex"]  # what `"service_tier": "flex"` gets on the server
POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class TierWorkload:
    """Interactive requests at `interactive_rate` per second, and a backlog of batch requests."""

    num_interactive: int = 24
    interactive_rate: float = 4.0  # requests per second, Poisson
    interactive_output_len: int = 24
    num_batch: int = 48
    batch_output_len: int = 96
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_interactive", "interactive_output_len", "num_batch", "batch_output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.interactive_rate > 0:
            raise ValueError(f"interactive_rate must be > 0, got {self.interactive_rate}")


@dataclass
class TierRun:
    """One run of a workload: what interactive requests saw, and how the backlog went."""

    policy: str
    with_backlog: bool
    ttft_s: list[float]  # per interactive request, from its scheduled arrival
    itl_s: list[float]  # every gap between two tokens of an interactive request
    interactive_tokens: int
    batch_tokens: int  # output tokens of the backlog (0 without one)
    batch_makespan_s: float  # start -> the last batch request finished (0 without one)
    wall_s: float  # start -> everything finished
    num_preemptions: int

    @property
    def batch_tokens_per_s(self) -> float:
        return self.batch_tokens / self.batch_makespan_s if self.batch_makespan_s else 0.0

    @property
    def total_tokens_per_s(self) -> float:
        """Every output token the engine produced in the run, per second of the run."""
        return (self.interactive_tokens + self.batch_tokens) / self.wall_s


def _arrival_offsets(workload: TierWorkload) -> list[float]:
    rng = random.Random(workload.seed)
    t, offsets = 0.0, []
    for _ in range(workload.num_interactive):
        offsets.append(t)
        t += rng.expovariate(workload.interactive_rate)
    return offsets


def run_tier_workload(llm: LLM, workload: TierWorkload, with_backlog: bool) -> TierRun:
    """Serve `workload` on `llm.engine` (its scheduling policy decides who goes first)."""
    engine = llm.engine
    if engine.has_unfinished_requests():
        raise RuntimeError("the engine is busy: a tier run needs it to itself")
    policy = engine.config.scheduling_policy
    interactive_prompts = noodle_requests(workload.num_interactive, seed=workload.seed)
    interactive_params = SamplingParams(temperature=0, max_tokens=workload.interactive_output_len, ignore_eos=True)
    offsets = _arrival_offsets(workload)
    preemptions_before = engine.scheduler.num_preemptions
    batch = []
    start = time.perf_counter()
    if with_backlog:
        batch_params = SamplingParams(temperature=0, max_tokens=workload.batch_output_len, ignore_eos=True)
        priority = BATCH_PRIORITY if policy == "priority" else 0
        for i, item in enumerate(noodle_requests(workload.num_batch, seed=workload.seed + 1)):
            batch.append(engine.add_request(f"tier-batch-{i}", item.prompt, batch_params, priority))
    interactive, due = [], list(zip(offsets, interactive_prompts))
    while due or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while due and due[0][0] <= now:
            offset, item = due.pop(0)
            request = engine.add_request(f"tier-chat-{len(interactive)}", item.prompt, interactive_params)
            interactive.append((start + offset, request))
        if engine.has_unfinished_requests():
            engine.step_requests()
        elif due:
            time.sleep(max(0.0, due[0][0] - (time.perf_counter() - start)))
    wall = time.perf_counter() - start
    ttft, itl = [], []
    for arrival, request in interactive:
        times = request.metrics.token_times
        ttft.append(times[0] - arrival)
        itl += [b - a for a, b in zip(times, times[1:])]
    return TierRun(
        policy=policy,
        with_backlog=with_backlog,
        ttft_s=ttft,
        itl_s=itl,
        interactive_tokens=sum(len(r.output_token_ids) for _, r in interactive),
        batch_tokens=sum(len(r.output_token_ids) for r in batch),
        batch_makespan_s=max((r.metrics.finished_time for r in batch), default=start) - start,
        wall_s=wall,
        num_preemptions=engine.scheduler.num_preemptions - preemptions_before,
    )


@dataclass
class TiersResult:
    workload: TierWorkload
    runs: dict[tuple[str, bool], list[TierRun]] = field(default_factory=dict)  # (policy, backlog) -> repeats


def measure_tiers(workload: TierWorkload | None = None, model: str | None = "noodle-chef", num_repeats: int = 3,
                  device: str | None = None, **engine_args) -> TiersResult:
    """The four conditions, `num_repeats` times each, in an order that rotates every repeat.
    `engine_args`: EngineConfig fields shared by both engines (max_num_seqs, ...)."""
    workload = workload or TierWorkload()
    llms = {policy: LLM(model, device=device, record_trace=False, scheduling_policy=policy, **engine_args)
            for policy in POLICIES}
    conditions = [(policy, backlog) for policy in POLICIES for backlog in (False, True)]
    result = TiersResult(workload, {c: [] for c in conditions})
    run_tier_workload(llms["fcfs"], TierWorkload(num_interactive=2, num_batch=2, seed=workload.seed), True)  # warm-up
    for repeat in range(num_repeats):
        k = repeat % len(conditions)
        for policy, backlog in conditions[k:] + conditions[:k]:
            result.runs[(policy, backlog)].append(run_tier_workload(llms[policy], workload, backlog))
    for llm in llms.values():
        if llm.engine.block_pool.num_used_blocks:
            raise RuntimeError("a tier run left KV blocks allocated")
    return result


def _spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def summary(runs: list[TierRun]) -> dict[str, list[float]]:
    """Per repeat: interactive TTFT and ITL P50/P99 (ms), tokens/s of the backlog and in all."""
    return {
        "TTFT p50 ms": [1000 * percentile(r.ttft_s, 50) for r in runs],
        "TTFT p99 ms": [1000 * percentile(r.ttft_s, 99) for r in runs],
        "ITL p50 ms": [1000 * percentile(r.itl_s, 50) for r in runs],
        "ITL p99 ms": [1000 * percentile(r.itl_s, 99) for r in runs],
        "batch tok/s": [r.batch_tokens_per_s for r in runs],
        "all tok/s": [r.total_tokens_per_s for r in runs],
        "preemptions": [float(r.num_preemptions) for r in runs],
    }


def tiers_table(result: TiersResult) -> pd.DataFrame:
    """One row per condition: medians over repeats with [min-max] (as strings, to print)."""
    rows = []
    for (policy, backlog), runs in result.runs.items():
        row = {"policy": policy, "batch backlog": "yes" if backlog else "no"}
        for name, values in summary(runs).items():
            if name == "batch tok/s" and not backlog:
                row[name] = "-"
            else:
                row[name] = _spread(values, 0 if name == "preemptions" else 1)
        rows.append(row)
    return pd.DataFrame(rows)


def median_of(result: TiersResult, policy: str, backlog: bool, name: str) -> float:
    """The median over repeats of one `summary` column of one condition."""
    return statistics.median(summary(result.runs[(policy, backlog)])[name])


def p99_ttft_ratio(result: TiersResult) -> float:
    """Interactive TTFT P99 under a backlog, FCFS / priority (> 1: the tiers help), the median of
    the per-repeat ratios (a repeat's two runs ran back to back)."""
    fcfs = summary(result.runs[("fcfs", True)])["TTFT p99 ms"]
    prio = summary(result.runs[("priority", True)])["TTFT p99 ms"]
    return statistics.median(f / p for f, p in zip(fcfs, prio))
