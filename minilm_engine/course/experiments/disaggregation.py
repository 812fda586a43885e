"""Chapter 10's measurement: decode latency while long prompts arrive, three ways.

    (a) mixed      one engine, no chunked prefill: a long prompt runs whole, in one step, and
                   every streaming request waits for that step
    (b) chunked    one engine with chunked prefill: a small `max_num_batched_tokens`, the long
                   prompt cut into chunks that share steps with the decodes
    (c) disagg     a prefill engine and a decode engine (`distributed/kv_transfer/`): the
                   prompt's KV copied from one pool to the other, decodes never share a step
                   with a prompt

Contract: `compare_disaggregation(model, workload, num_repeats)` runs the same `DisaggWorkload`
(the same prompts, seeds and arrival times) on the three configurations, alternating them in
each repeat, and returns one row per (configuration, repeat): decode ITL P50 / P99 / max (over
every gap between two tokens of one request, streams and long prompts alike), TTFT of the long
prompts (median) and P99 over all requests, the makespan and the device-seconds busy, the
KV-transfer bytes and time, and whether the tokens are those of (a) in the same repeat.
`summarize(table)` gives median and [min, max] per configuration.

The clock, and what is honest on one CPU.  Every configuration is timed the same way: each
engine (standing for one device) has its own clock, which advances by the measured wall time
of each of its steps; a request arrives at a time on that clock and joins the first step that
starts after it; a token's time is the clock when the step that made it ends.  For one engine
this is its wall clock with idle gaps skipped.  The two engines of (c) share this machine's
cores and run in one thread, one step at a time, so the wall clock would charge the decode
engine for the prefill engine's steps, which separate hardware would not: each engine's clock
counts only its own steps, the speeds measured here on two devices that do not contend.  A
hand-over reaches the consumer when the producer's step ends; the consumer pulls the KV when it
next steps, and its clock pays for the copy (a memory copy here; the bytes are reported, so a
network link's time, bytes / bandwidth, can be added).  (c) uses two devices: its device-seconds
are both engines' busy time, so compare cost there, not in the makespan.

A step is timed in CPU seconds of this process (`time.process_time`) when the engines run on
the CPU with one torch thread: that is the wall time of an idle machine, and other programs on
a busy one do not inflate it.  Otherwise (several threads, whose CPU time would add up; or a
GPU) in wall seconds (`time.perf_counter`; each step ends by reading its sampled tokens back,
which waits for the GPU).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from minilm_engine.course.noodle_corpus import sample_prompts
from minilm_engine.distributed.kv_transfer import DisaggRouter
from minilm_engine.entrypoints.llm_engine import LLMEngine
from minilm_engine.entrypoints.llm import LLM
from minilm_engine.core.request import Request
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.experiments.prefill import corpus_token_ids

CONFIGS = ("mixed", "chunked", "disagg")
METRICS = (
    "itl_p50_ms", "itl_p99_ms", "itl_max_ms", "ttft_long_ms", "ttft_p99_ms",
    "makespan_s", "device_s", "kv_tokens", "kv_cached_tokens", "kv_mib", "kv_transfer_ms",
)


@dataclass(frozen=True)
class DisaggWorkload:
    """Streams that start together and decode, and long prompts that arrive among them.

    Every request samples (temperature, top-p) with its own seed and ignores EOS, so each makes
    exactly its max_tokens and every configuration computes the same tokens.  `long_arrivals_s`:
    when the long prompts arrive (seconds after the streams); None: spread evenly over the
    streams' life, from a measured decode step (`compare_disaggregation`).
    """

    num_streams: int = 8
    stream_max_tokens: int = 96
    num_long_prompts: int = 3
    long_prompt_tokens: int = 768
    long_max_tokens: int = 16
    temperature: float = 0.8
    top_p: float = 0.95
    seed: int = 0
    long_arrivals_s: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("num_streams", "stream_max_tokens", "num_long_prompts", "long_prompt_tokens", "long_max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.long_arrivals_s is not None and len(self.long_arrivals_s) != self.num_long_prompts:
            raise ValueError(
                f"long_arrivals_s has {len(self.long_arrivals_s)} times for {self.num_long_prompts} long prompts"
            )

    def streams(self, tokenizer) -> list[Arrival]:
        """The streams, s0 .. s{num_streams - 1}: short noodle-shop prompts, all at time 0."""
        out = []
        for i, text in enumerate(sample_prompts(self.num_streams, self.seed)):
            ids = tokenizer.encode(text, add_special_tokens=True)
            out.append(Arrival(f"s{i}", 0.0, ids, self._params(self.stream_max_tokens, i)))
        return out

    def requests(self, tokenizer) -> list[Arrival]:
        """The streams, then the long prompts l0 .. (corpus text, each its own), by arrival."""
        if self.long_arrivals_s is None:
            raise ValueError("long_arrivals_s is not set: use with_arrivals() first")
        out = self.streams(tokenizer)
        n = self.long_prompt_tokens
        ids = corpus_token_ids(tokenizer, n * self.num_long_prompts, self.seed)
        for j, at in enumerate(self.long_arrivals_s):
            params = self._params(self.long_max_tokens, self.num_streams + j)
            out.append(Arrival(f"l{j}", at, ids[j * n : (j + 1) * n], params))
        return sorted(out, key=lambda a: a.time_s)

    def with_arrivals(self, decode_step_s: float) -> DisaggWorkload:
        """The long prompts spread evenly over the streams' life, if it were all decode steps."""
        life = self.stream_max_tokens * decode_step_s
        times = tuple(life * (j + 1) / (self.num_long_prompts + 1) for j in range(self.num_long_prompts))
        return DisaggWorkload(**{**self.__dict__, "long_arrivals_s": times})

    def _params(self, max_tokens: int, index: int) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, max_tokens=max_tokens,
            ignore_eos=True, seed=self.seed * 1000 + index,
        )


@dataclass(frozen=True)
class Arrival:
    name: str
    time_s: float
    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass
class Run:
    """One configuration's run: every request's arrival and token times, on the clock(s)."""

    config: str
    arrival_s: dict[str, float] = field(default_factory=dict)
    token_times_s: dict[str, list[float]] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    device_s: float = 0.0  # busy time, summed over the devices
    kv_tokens: int = 0
    kv_cached_tokens: int = 0
    kv_bytes: int = 0
    kv_transfer_s: float = 0.0  # the consumer's pulls, on its clock

    def stamp(self, requests: Sequence[Request], now: float) -> None:
        for r in requests:
            times = self.token_times_s.setdefault(r.request_id, [])
            times += [now] * (len(r.output_token_ids) - len(times))

    def row(self) -> dict:
        gaps = sorted(b - a for t in self.token_times_s.values() for a, b in zip(t, t[1:]))
        ttft = {rid: t[0] - self.arrival_s[rid] for rid, t in self.token_times_s.items()}
        long_ttft = [v for rid, v in ttft.items() if rid.split("-")[-1].startswith("l")]
        return {
            "config": self.config,
            "itl_p50_ms": 1e3 * percentile(gaps, 50),
            "itl_p99_ms": 1e3 * percentile(gaps, 99),
            "itl_max_ms": 1e3 * gaps[-1],
            "ttft_long_ms": 1e3 * statistics.median(long_ttft),
            "ttft_p99_ms": 1e3 * percentile(sorted(ttft.values()), 99),
            "makespan_s": max(t[-1] for t in self.token_times_s.values()),
            "device_s": self.device_s,
            "kv_tokens": self.kv_tokens,
            "kv_cached_tokens": self.kv_cached_tokens,
            "kv_mib": self.kv_bytes / 2**20,
            "kv_transfer_ms": 1e3 * self.kv_transfer_s,
        }


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile, linear between the two nearest ranks (numpy's default)."""
    position = (len(sorted_values) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


# -- the three configurations -------------------------------------------------------------------


def build_configs(
    model: str | None = None, device: str | None = None, chunk_tokens: int = 64, max_num_seqs: int = 16,
    max_model_len: int | None = None,
) -> dict[str, LLM | DisaggRouter]:
    """(a), (b) and (c), each its own engine(s) loading `model`.  In (a) and in (c)'s producer
    a prompt runs whole (no chunking, a budget of a whole context); (b) chunks under
    `chunk_tokens`; (c)'s consumer only decodes (it would prefill only what it had to preempt)."""
    common = dict(device=device, max_model_len=max_model_len, max_num_seqs=max_num_seqs, record_trace=False)
    chunked = LLM(model, **common, enable_chunked_prefill=True, max_num_batched_tokens=chunk_tokens)
    whole = dict(enable_chunked_prefill=False, max_num_batched_tokens=chunked.max_model_len)
    mixed = LLM(model, **common, **whole)
    disagg = DisaggRouter.from_model(model, **common, prefill=whole)
    return {"mixed": mixed, "chunked": chunked, "disagg": disagg}


def _ready(engine: LLMEngine) -> None:
    if engine.has_unfinished_requests():
        raise ValueError("the engine must be idle: finish or abort its requests first")
    engine.block_pool.reset_prefix_cache()  # a repeat computes what the first run did


def _add(llm: LLM, add, arrival: Arrival, run: Run, run_id: str) -> None:
    rid = f"{run_id}-{arrival.name}"
    request = llm.input_processor.make_request(rid, {"prompt_token_ids": arrival.prompt_token_ids}, arrival.params)
    request.incremental_text = False  # text is not measured: decode it once, at the end
    add(request)
    run.arrival_s[rid] = arrival.time_s
    run.tokens[arrival.name] = request.output_token_ids  # the live list: complete at the end


Timer = Callable[[], float]


def step_timer(llm: LLM) -> Timer:
    """CPU seconds of the process on a CPU with one torch thread, else wall seconds (module docstring)."""
    if llm.device.type == "cpu" and torch.get_num_threads() == 1:
        return time.process_time
    return time.perf_counter


def run_one_engine(llm: LLM, arrivals: Sequence[Arrival], label: str, run_id: str) -> Run:
    """Step one engine on one clock (module docstring) until every request is done."""
    engine = llm.engine
    _ready(engine)
    timer = step_timer(llm)
    run = Run(label)
    clock, i = 0.0, 0
    while i < len(arrivals) or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests():
            clock = max(clock, arrivals[i].time_s)  # idle until the next arrival
        while i < len(arrivals) and arrivals[i].time_s <= clock:
            _add(llm, engine.add_prepared_request, arrivals[i], run, run_id)
            i += 1
        start = timer()
        advanced = engine.step_requests()
        elapsed = timer() - start
        clock += elapsed
        run.device_s += elapsed
        run.stamp(advanced, clock)
    return run


def run_disaggregated(router: DisaggRouter, arrivals: Sequence[Arrival], label: str, run_id: str) -> Run:
    """Step the prefill and decode engines on a clock each (module docstring)."""
    producer, consumer = router.kv_producer.engine, router.kv_consumer.engine
    _ready(producer)
    _ready(consumer)
    timer = step_timer(router.kv_consumer)
    run = Run(label)
    p_clock = d_clock = 0.0
    handed_at: dict[str, float] = {}  # when each hand-over left the producer (its clock)
    num_transfers = router.stats.num_requests
    i = 0
    while i < len(arrivals) or router.has_unfinished_requests():
        # When could each engine act next?  The producer waits while a hand-over is pending.
        p_next = d_next = None
        if not router.pending:
            if producer.has_unfinished_requests():
                p_next = p_clock
            elif i < len(arrivals):
                p_next = max(p_clock, arrivals[i].time_s)
        if consumer.has_unfinished_requests():
            d_next = d_clock
        elif router.pending:
            d_next = max(d_clock, handed_at[router.pending[0].request_id])
        if p_next is None and d_next is None:
            raise RuntimeError("neither engine can act")
        if d_next is None or (p_next is not None and p_next < d_next):
            p_clock = p_next
            while i < len(arrivals) and arrivals[i].time_s <= p_clock:
                _add(router.kv_producer, router.add_prepared_request, arrivals[i], run, run_id)
                i += 1
            start = timer()
            advanced = router.step_prefill()
            elapsed = timer() - start
            p_clock += elapsed
            run.device_s += elapsed
            run.stamp(advanced, p_clock)
            for request in router.pending:
                handed_at.setdefault(request.request_id, p_clock)
        else:
            d_clock = d_next
            was_pending = bool(router.pending)
            start = timer()
            # Pull what has reached the consumer by its clock; the copies count on its clock.
            transfers = router.transfer_pending(ready=lambda r, now=d_clock: handed_at[r.request_id] <= now)
            copied = timer()
            advanced = router.step_decode()
            elapsed = timer() - start
            d_clock += elapsed
            run.device_s += elapsed
            run.kv_transfer_s += copied - start if transfers else 0.0
            run.stamp(advanced, d_clock)
            if was_pending and not router.pending:
                p_clock = max(p_clock, d_clock)  # the producer resumes once its queue is taken
            if not transfers and not advanced:
                raise RuntimeError("the consumer could take nothing (a request larger than its pool?)")
    new = router.stats.transfers[num_transfers:]
    run.kv_tokens = sum(t.num_tokens for t in new)
    run.kv_cached_tokens = sum(t.num_cached_tokens for t in new)
    run.kv_bytes = sum(t.num_bytes for t in new)
    return run


def run_config(system: LLM | DisaggRouter, arrivals: Sequence[Arrival], label: str, run_id: str) -> Run:
    if isinstance(system, DisaggRouter):
        return run_disaggregated(system, arrivals, label, run_id)
    return run_one_engine(system, arrivals, label, run_id)


# -- the comparison -----------------------------------------------------------------------------


def decode_step_s(llm: LLM, workload: DisaggWorkload, num_steps: int = 12) -> float:
    """Median time of a decode step of the workload's streams alone (on `llm`, one engine)."""
    engine = llm.engine
    _ready(engine)
    for j, a in enumerate(workload.streams(llm.tokenizer)):
        params = SamplingParams(temperature=0, max_tokens=num_steps + 1, ignore_eos=True)
        engine.add_request(f"calibrate-{engine.num_steps}-{j}", {"prompt_token_ids": a.prompt_token_ids}, params)
    engine.step_requests()  # the streams' prompts
    timer, times = step_timer(llm), []
    while engine.has_unfinished_requests():
        start = timer()
        engine.step_requests()
        times.append(timer() - start)
    return statistics.median(times)


def compare_disaggregation(
    model: str | None = None,
    workload: DisaggWorkload = DisaggWorkload(),
    num_repeats: int = 3,
    chunk_tokens: int = 64,
    device: str | None = None,
    max_model_len: int | None = None,
    configs: dict[str, LLM | DisaggRouter] | None = None,
):
    """One row per (configuration, repeat) (module docstring); configurations alternate within
    each repeat, after one warm-up run each.  Returns (table, workload with its arrival times).

    `configs`: from `build_configs` (built here if None).  Without `workload.long_arrivals_s`,
    the long prompts are spread over the streams' life from a measured decode step of (a).
    """
    import pandas as pd

    configs = configs or build_configs(model, device, chunk_tokens, workload.num_streams + workload.num_long_prompts,
                                       max_model_len)
    if set(configs) != set(CONFIGS):
        raise ValueError(f"configs must be {CONFIGS}, got {sorted(configs)}")
    if workload.long_arrivals_s is None:
        workload = workload.with_arrivals(decode_step_s(configs["mixed"], workload))
    arrivals = workload.requests(configs["mixed"].tokenizer)
    for label in CONFIGS:
        run_config(configs[label], arrivals, label, f"warmup-{label}")
    rows = []
    for repeat in range(num_repeats):
        reference = None
        for label in CONFIGS:
            run = run_config(configs[label], arrivals, label, f"r{repeat}-{label}")
            reference = reference or run.tokens
            rows.append({**run.row(), "repeat": repeat, "same_tokens": run.tokens == reference})
    return pd.DataFrame(rows), workload


def summarize(table):
    """Per configuration, in CONFIGS order: each metric's median, min and max over the repeats
    (columns `metric`, `metric_min`, `metric_max`), and whether every run had (a)'s tokens."""
    import pandas as pd

    rows = []
    for label in CONFIGS:
        runs = table[table["config"] == label]
        row = {"config": label, "num_repeats": len(runs), "same_tokens": bool(runs["same_tokens"].all())}
        for metric in METRICS:
            row[metric] = float(runs[metric].median())
            row[f"{metric}_min"] = float(runs[metric].min())
            row[f"{metric}_max"] = float(runs[metric].max())
        rows.append(row)
    return pd.DataFrame(rows)
