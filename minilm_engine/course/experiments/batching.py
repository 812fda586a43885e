"""Chapter 01's measurements: what a decode step costs as the batch grows, and what the two
batching policies do with the same requests.

Contract: every function here runs the package's real model or engine and returns plain
dataclasses; the figure helpers at the bottom draw them (plotly is
imported only there).  Timings are wall-clock on whatever machine runs them: medians of several
runs, synchronised on a GPU.

The cost model of one decode step (one new token for each of `B` requests):

    time(B) >= max( weight_bytes / memory_bandwidth,          every weight is read once per step
                    2 * num_params * B / matmul_flops )        each token costs ~2 FLOPs per weight

The first floor does not grow with B, the second does; they cross at

    B* = (matmul_flops / memory_bandwidth) * (bytes per weight / 2)

Below B*, extra requests ride along almost for free ("batching 32 costs little more than 1");
above it, each step grows with B.  That holds at short contexts only: every request also makes
the step read its whole KV cache, so the memory floor is really

    (weight_bytes + B * context_len * kv_bytes_per_token) / memory_bandwidth

and at long contexts it grows with B too (32 Llama-3-8B requests at 4K tokens read as many KV
bytes as weight bytes): `DecodeCostModel` has both, `context_sweep` compares contexts.  A datacenter GPU in bf16 has B* in the hundreds; a CPU core
running fp32 has B* in the tens.  Tiny models add a third cost neither floor knows: a fixed
per-step overhead (Python, kernel launches) that also does not grow with B.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from minilm_engine.course.noodle_corpus import sample_prompts
from minilm_engine.course.machine import describe_machine
from minilm_engine.course.baselines.contiguous_cache import ContiguousKVCache, forward_rows
from minilm_engine.model.fused import fused_weight_bytes
from minilm_engine.core.outputs import RequestOutput
# one count of weight bytes for the package (a tied embedding once; a quantized layer's codes,
# scales and offsets included); chapter 01 and the benchmarks import it from here
from minilm_engine.model.quantization.linear import weight_bytes
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.experiments.workloads import Workload

# -- the hardware --------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, num_repeats: int, device: torch.device) -> float:
    fn()  # warm-up: allocations, lazy initialisation, caches
    times = []
    for _ in range(num_repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def hardware_summary(device: str | torch.device = "cpu") -> str:
    """One line naming what the numbers were measured on: the GPU, or the CPU's model, vector ISA
    and cores (`machine.describe_machine`), with torch's version and threads."""
    device = torch.device(device)
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else describe_machine()
    return (
        f"{device.type}: {what} | torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op thread(s)"
    )


def measure_copy_bandwidth(
    num_bytes: int = 1 << 28, num_repeats: int = 5, device: str | torch.device = "cpu"
) -> float:
    """Memory bandwidth in bytes/s: copy a `num_bytes` tensor, count bytes read + written.

    The tensor should be much larger than the last-level cache, or the copy measures the cache.
    """
    device = torch.device(device)
    src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = _median_time(lambda: dst.copy_(src), num_repeats, device)
    return 2 * src.numel() * src.element_size() / seconds


def measure_matmul_flops(
    n: int = 1024,
    num_repeats: int = 5,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> float:
    """Matmul throughput in FLOP/s: an (n, n) @ (n, n) product is 2 n^3 FLOPs."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    seconds = _median_time(lambda: a @ b, num_repeats, device)
    return 2 * n**3 / seconds


def step_weight_bytes(model: torch.nn.Module) -> int:
    """The weight bytes one decode step reads: every parameter and buffer as loaded (quantized
    codes, scales, offsets) and the fused CPU path's packed weights, which are not parameters
    (`model/fused.py`; the default backend fuses wherever it runs).  Every weight-read
    floor in the chapters divides this by a measured bandwidth (`LLM.weight_bytes` is the same
    sum, for an engine)."""
    return weight_bytes(model) + fused_weight_bytes(model)


@dataclass(frozen=True)
class DecodeCostModel:
    """The floors under one decode step (see the module docstring), KV reads included.

    A step of `B` requests at `context_len` tokens each reads every weight once **and** every
    request's cached keys and values (`B * context_len * kv_bytes_per_token`):

        memory floor  = (weight_bytes + B * context_len * kv_bytes_per_token) / bandwidth
        compute floor = 2 * num_params * B / flops
        step time    >= max(memory floor, compute floor)

    With `context_len=0` this is the weights-only model.  (Attention's own FLOPs, 4 per cached
    element per query head, are left out: a few percent of the step below ~10K tokens.)
    """

    num_params: int
    weight_bytes: int
    bandwidth: float  # bytes/s, from measure_copy_bandwidth
    flops: float  # FLOP/s, from measure_matmul_flops
    kv_bytes_per_token: int = 0  # 2 x layers x KV heads x head_dim x bytes per element

    @classmethod
    def measure(cls, model: torch.nn.Module, num_repeats: int = 5) -> "DecodeCostModel":
        """Measure bandwidth and FLOP/s on the model's device, in the model's dtype."""
        device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
        return cls(
            num_params=model.config.num_parameters(),
            weight_bytes=step_weight_bytes(model),
            bandwidth=measure_copy_bandwidth(num_repeats=num_repeats, device=device),
            # A GPU needs big products to reach its peak; a CPU core gets there at 1024.
            flops=measure_matmul_flops(
                n=8192 if device.type == "cuda" else 1024,
                num_repeats=num_repeats, device=device, dtype=dtype,
            ),
            kv_bytes_per_token=model.config.kv_bytes_per_token(dtype.itemsize),
        )

    @classmethod
    def for_shapes(
        cls, config, bandwidth: float, flops: float, bytes_per_element: int = 2
    ) -> "DecodeCostModel":
        """A model known by its shapes (`course/known_configs.py`) on a machine known by its
        rates (a datasheet's bandwidth and FLOP/s): no measurement."""
        num_params = config.num_parameters()
        return cls(num_params, num_params * bytes_per_element, bandwidth, flops,
                   config.kv_bytes_per_token(bytes_per_element))

    def kv_read_bytes(self, batch_size: int, context_len: int = 0) -> int:
        return batch_size * context_len * self.kv_bytes_per_token

    def memory_floor_s(self, batch_size: int, context_len: int = 0) -> float:
        """Every weight once, plus every request's KV cache (grows with batch x context)."""
        return (self.weight_bytes + self.kv_read_bytes(batch_size, context_len)) / self.bandwidth

    def compute_floor_s(self, batch_size: int) -> float:
        return 2 * self.num_params * batch_size / self.flops

    def floor_s(self, batch_size: int, context_len: int = 0) -> float:
        return max(self.memory_floor_s(batch_size, context_len), self.compute_floor_s(batch_size))

    @property
    def crossover_batch(self) -> float:
        """The batch size at which the compute floor overtakes the weights-only memory floor."""
        return self.weight_bytes * self.flops / (2 * self.num_params * self.bandwidth)

    def slowdown(self, batch_size: int, context_len: int = 0) -> float:
        """How many times a step of `batch_size` takes a step of 1, at the same context."""
        return self.floor_s(batch_size, context_len) / self.floor_s(1, context_len)

    def batch_at_slowdown(self, context_len: int = 0, slowdown: float = 2.0, max_batch: int = 1 << 16) -> int | None:
        """The smallest batch whose step takes `slowdown` times the batch-1 step: where
        batching stops being (nearly) free.  None if no batch up to `max_batch` does."""
        low, high = 1, max_batch
        if self.slowdown(high, context_len) < slowdown:
            return None
        while low < high:  # the slowdown grows with the batch: bisect
            mid = (low + high) // 2
            if self.slowdown(mid, context_len) >= slowdown:
                high = mid
            else:
                low = mid + 1
        return low


# -- one decode step ------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeTiming:
    batch_size: int
    step_s: float  # median wall time of one decode step
    min_step_s: float
    round_step_s: tuple[float, ...] = ()  # each interleaved round's median (see _sweep), for intervals
    steps_s: tuple[float, ...] = ()  # every timed step (of every round, after _sweep): for a P99

    @property
    def tokens_per_s(self) -> float:
        return self.batch_size / self.step_s


@torch.inference_mode()
def time_decode_step(
    model, batch_size: int, context_len: int = 32, num_steps: int = 10, seed: int = 0
) -> DecodeTiming:
    """Time decode steps of `batch_size` requests whose prompts of `context_len` tokens are in a
    contiguous KV cache: each step feeds one token per request, runs the model, and picks the
    argmax.  Returns the median (and min) over `num_steps` steps after one warm-up step."""
    device = model.device
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    cache = ContiguousKVCache(
        model.config, batch_size, context_len + num_steps + 1, model.dtype, device
    )
    # 1. Prefill: the whole prompt of every request in one forward.
    ids = torch.randint(vocab, (batch_size, context_len), generator=generator).to(device)  # (B, P)
    positions = torch.arange(context_len, device=device)[None].expand(batch_size, -1)  # (B, P)
    cache.begin_step(torch.ones(batch_size, context_len, dtype=torch.bool, device=device))
    hidden = forward_rows(model, ids, positions, cache)  # (B, P, hidden)
    next_ids = model.compute_logits(hidden[:, -1]).argmax(-1)[:, None]  # (B, 1)
    one_valid = torch.ones(batch_size, 1, dtype=torch.bool, device=device)
    # 2. Decode steps, one token per request each, timed one by one (the first is a warm-up).
    times = []
    for step in range(num_steps + 1):
        positions = torch.full((batch_size, 1), context_len + step, device=device)  # (B, 1)
        _sync(device)
        start = time.perf_counter()
        cache.begin_step(one_valid)
        hidden = forward_rows(model, next_ids, positions, cache)  # (B, 1, hidden)
        next_ids = model.compute_logits(hidden[:, -1]).argmax(-1)[:, None]  # (B, 1)
        _sync(device)
        times.append(time.perf_counter() - start)
    times = times[1:]
    return DecodeTiming(batch_size, statistics.median(times), min(times), steps_s=tuple(times))


def time_engine_decode_step(
    llm, batch_size: int, num_steps: int = 10, seed: int = 0
) -> DecodeTiming:
    """Time `engine.step()` of the continuous engine while exactly `batch_size` requests decode.

    Everything a served token costs is in it: scheduling, block bookkeeping, paged attention,
    sampling and detokenizing.  The engine must be idle and allow `batch_size` running requests;
    the requests are aborted before returning.
    """
    engine = llm.engine
    if engine.has_unfinished_requests():
        raise ValueError("the engine still has unfinished requests; time an idle engine")
    if batch_size > engine.config.max_num_seqs:
        raise ValueError(f"batch_size {batch_size} > max_num_seqs {engine.config.max_num_seqs}")
    # Room for the prefill steps (a big batch's prompts may need several, chunked), a warm-up
    # and the timed steps; the requests are aborted once timed.
    params = SamplingParams(temperature=0, max_tokens=num_steps + 64, ignore_eos=True)
    requests = [
        engine.add_request(f"decode-timing-{i}", prompt, params)
        for i, prompt in enumerate(sample_prompts(batch_size, seed))
    ]
    # 1. Prefill steps, until every request has its first token and only decodes remain.
    while engine.scheduler.waiting or any(not r.output_token_ids for r in requests):
        engine.step()
    # 2. One warm-up step, then `num_steps` timed steps of exactly `batch_size` decode tokens.
    engine.step()
    times = []
    for _ in range(num_steps):
        engine.step()
        record = engine.trace.records[-1]
        if record.num_decode_tokens != batch_size or record.num_prefill_tokens:
            raise RuntimeError(f"step {record.step} was not a pure decode step of {batch_size}")
        times.append(record.duration_s)
    for r in requests:
        engine.abort_request(r.request_id)
    return DecodeTiming(batch_size, statistics.median(times), min(times), steps_s=tuple(times))


def _sweep(measure, batch_sizes: list[int], num_rounds: int) -> list[DecodeTiming]:
    """measure(b) for every batch size, `num_rounds` interleaved rounds (so a burst of other
    work on a shared machine does not land on one batch size only); keep each size's fastest
    median, and every round's median in `round_step_s` (round i of two sizes ran close in time:
    their ratio round by round is a paired measurement), and every timed step in `steps_s`."""
    best: dict[int, DecodeTiming] = {}
    rounds: dict[int, list[float]] = {}
    steps: dict[int, list[float]] = {}
    for _ in range(num_rounds):
        for b in sorted(batch_sizes):
            timing = measure(b)
            rounds.setdefault(b, []).append(timing.step_s)
            steps.setdefault(b, []).extend(timing.steps_s)
            if b not in best or timing.step_s < best[b].step_s:
                best[b] = timing
    return [replace(best[b], round_step_s=tuple(rounds[b]), steps_s=tuple(steps[b])) for b in sorted(best)]


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache (Linux sysfs), or None where it cannot be read.  A model whose
    weights fit in it is not read from main memory, so the copy bandwidth overstates its floor."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes) if sizes else None


def decode_sweep(
    model, batch_sizes: list[int], context_len: int = 32, num_steps: int = 10, num_rounds: int = 1
) -> list[DecodeTiming]:
    """`time_decode_step` (the bare model, contiguous cache) for each batch size."""
    return _sweep(
        lambda b: time_decode_step(model, b, context_len, num_steps), batch_sizes, num_rounds
    )


def engine_decode_sweep(
    llm, batch_sizes: list[int], num_steps: int = 10, num_rounds: int = 1
) -> list[DecodeTiming]:
    """`time_engine_decode_step` (the whole continuous engine) for each batch size."""
    return _sweep(lambda b: time_engine_decode_step(llm, b, num_steps), batch_sizes, num_rounds)


def batching_gain(
    timings: list[DecodeTiming], small: int = 1, large: int = 32
) -> tuple[float, float]:
    """(step time ratio, tokens/s ratio) of batch `large` over batch `small`: the claim "batching
    32 requests costs little more than 1" says the first is near 1 and the second near 32."""
    by_size = {t.batch_size: t for t in timings}
    missing = [b for b in (small, large) if b not in by_size]
    if missing:
        raise ValueError(f"no timing for batch size(s) {missing}; have {sorted(by_size)}")
    a, b = by_size[small], by_size[large]
    return b.step_s / a.step_s, b.tokens_per_s / a.tokens_per_s


# -- serving a workload ---------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the two nearest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class ServingRun:
    """One `generate` call over a workload: wall time and what each request saw."""

    strategy: str
    max_num_seqs: int
    wall_s: float
    output_lens: list[int]
    e2e_latencies: list[float]
    ttfts: list[float]
    num_steps: int | None = None  # engine steps (continuous only; static steps follow from lens)
    repeat_wall_s: tuple[float, ...] = ()  # every repeat's wall time (compare_serving), for intervals

    @classmethod
    def from_outputs(
        cls, strategy: str, max_num_seqs: int, wall_s: float, outputs: list[RequestOutput], **kw
    ) -> "ServingRun":
        return cls(
            strategy,
            max_num_seqs,
            wall_s,
            [len(o.outputs[0].token_ids) for o in outputs],
            [o.metrics.e2e_latency for o in outputs],
            [o.metrics.ttft for o in outputs],
            **kw,
        )

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def throughput(self) -> float:
        """Output tokens per second of wall time."""
        return self.num_output_tokens / self.wall_s

    def summary(self) -> dict[str, float | int | str]:
        lat = self.e2e_latencies
        return {
            "strategy": self.strategy,
            "requests": len(lat),
            "output tokens": self.num_output_tokens,
            "wall s": round(self.wall_s, 3),
            "tokens/s": round(self.throughput, 1),
            "mean latency s": round(statistics.mean(lat), 3),
            "p50 latency s": round(percentile(lat, 50), 3),
            "p99 latency s": round(percentile(lat, 99), 3),
            "mean TTFT s": round(statistics.mean(self.ttfts), 3),
        }


@dataclass
class TimedGenerate:
    """One timed `generate` call: wall time, outputs, and the engine's step records of exactly
    this call (None for the strategies without a step-wise engine)."""

    wall_s: float
    outputs: list[RequestOutput]
    records: list | None


def timed_generate(llm, workload: Workload) -> TimedGenerate:
    """Serve `workload` with `llm` in one `generate` call (all requests arrive at once).

    For the continuous strategy the engine's trace is cleared first, so afterwards it holds
    exactly this run (for `viz.BatchView(llm.engine)`).
    """
    engine = getattr(llm, "engine", None)
    if engine is not None:
        engine.trace.clear()
    start = time.perf_counter()
    outputs = llm.generate(workload.prompts, workload.sampling_params, use_tqdm=False)
    wall = time.perf_counter() - start
    records = list(engine.trace.records) if engine is not None else None
    return TimedGenerate(wall, outputs, records)


def run_workload(llm, workload: Workload) -> ServingRun:
    """`timed_generate`, summed up as a `ServingRun`."""
    timed = timed_generate(llm, workload)
    wall, outputs = timed.wall_s, timed.outputs
    num_steps = len(timed.records) if timed.records is not None else None
    return ServingRun.from_outputs(
        getattr(llm, "strategy_name", "continuous"), llm.engine_config.max_num_seqs, wall, outputs, num_steps=num_steps
    )


def compare_serving(
    llms: dict[str, object], workload: Workload, num_repeats: int = 1
) -> dict[str, ServingRun]:
    """Run the workload on every LLM, interleaved, `num_repeats` times; keep each one's fastest
    run (on a shared machine the fastest is the least disturbed), with every repeat's wall time
    in `repeat_wall_s` (repeat i of each LLM ran back to back: a paired measurement)."""
    best: dict[str, ServingRun] = {}
    walls: dict[str, list[float]] = {}
    for _ in range(num_repeats):
        for name, llm in llms.items():
            run = run_workload(llm, workload)
            walls.setdefault(name, []).append(run.wall_s)
            if name not in best or run.wall_s < best[name].wall_s:
                best[name] = run
    return {name: replace(run, repeat_wall_s=tuple(walls[name])) for name, run in best.items()}


# -- your latency depends on others' traffic -------------------------------------------------


@dataclass(frozen=True)
class ProbeLatency:
    """What one fixed "probe" request saw while `num_others` requests shared the engine."""

    num_others: int
    ttft_s: float  # medians over the repeats
    tpot_s: float
    e2e_s: float
    ttft_runs: list[float] = field(default_factory=list, compare=False)
    tpot_runs: list[float] = field(default_factory=list, compare=False)


def probe_latency(llm, probe: Workload, others: Workload, num_repeats: int = 3) -> ProbeLatency:
    """Submit the probe first and `others` right behind it in one `generate` call, and read the
    probe's own metrics; medians over `num_repeats` runs.  The others should ask for at least as
    many tokens as the probe, so they share every one of its steps."""
    if probe.num_requests != 1:
        raise ValueError(f"the probe must be one request, got {probe.num_requests}")
    ttfts, tpots, e2es = [], [], []
    for _ in range(num_repeats):
        outputs = llm.generate(
            probe.prompts + others.prompts,
            probe.sampling_params + others.sampling_params,
            use_tqdm=False,
        )
        metrics = outputs[0].metrics
        ttfts.append(metrics.ttft)
        tpots.append(metrics.tpot)
        e2es.append(metrics.e2e_latency)
    return ProbeLatency(
        others.num_requests,
        statistics.median(ttfts),
        statistics.median(tpots),
        statistics.median(e2es),
        ttfts,
        tpots,
    )


def latency_vs_neighbours(
    llm, probe: Workload, others: Workload, num_others: list[int], num_repeats: int = 3
) -> list[ProbeLatency]:
    """`probe_latency` with the first n requests of `others`, for each n in `num_others`."""
    if max(num_others) > others.num_requests:
        raise ValueError(f"need {max(num_others)} other requests, got {others.num_requests}")
    return [probe_latency(llm, probe, others[:n], num_repeats) for n in num_others]


@dataclass(frozen=True)
class ContextTiming:
    context_len: int
    timings: list[DecodeTiming]


def context_sweep(
    model, batch_sizes: list[int], context_lens: list[int], num_steps: int = 5
) -> list[ContextTiming]:
    """`time_decode_step` at every (context, batch): the measured side of the KV-read model."""
    return [
        ContextTiming(c, [time_decode_step(model, b, context_len=c, num_steps=num_steps) for b in batch_sizes])
        for c in context_lens
    ]


# -- figures ----------------------------------------------------------------------------------


def decode_sweep_figure(
    timings: list[DecodeTiming],
    cost: DecodeCostModel,
    engine_timings: list[DecodeTiming] | None = None,
    title: str = "",
):
    """Step time (with the memory and compute floors) and tokens/s against batch size, for the
    bare model and, if given, the whole continuous engine."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    batch = [t.batch_size for t in timings]
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("one decode step (ms)", "tokens per second")
    )
    fig.add_trace(go.Scatter(x=batch, y=[t.step_s * 1e3 for t in timings], mode="lines+markers",
                             name="model forward (contiguous cache)", line=dict(color="#1f77b4")),
                  1, 1)
    if engine_timings:
        fig.add_trace(go.Scatter(x=[t.batch_size for t in engine_timings],
                                 y=[t.step_s * 1e3 for t in engine_timings], mode="lines+markers",
                                 name="engine.step() (continuous, paged)",
                                 line=dict(color="#ff7f0e")), 1, 1)
    fig.add_trace(go.Scatter(x=batch, y=[cost.memory_floor_s(b) * 1e3 for b in batch],
                             mode="lines", line=dict(dash="dash"),
                             name="memory floor: weight bytes / bandwidth"), 1, 1)
    fig.add_trace(go.Scatter(x=batch, y=[cost.compute_floor_s(b) * 1e3 for b in batch],
                             mode="lines", line=dict(dash="dot"),
                             name="compute floor: 2 x params x B / FLOP/s"), 1, 1)
    fig.add_trace(go.Scatter(x=batch, y=[t.tokens_per_s for t in timings], mode="lines+markers",
                             showlegend=False, line=dict(color="#1f77b4")), 1, 2)
    if engine_timings:
        fig.add_trace(go.Scatter(x=[t.batch_size for t in engine_timings],
                                 y=[t.tokens_per_s for t in engine_timings], mode="lines+markers",
                                 showlegend=False, line=dict(color="#ff7f0e")), 1, 2)
    fig.add_trace(go.Scatter(x=batch, y=[b / cost.floor_s(b) for b in batch], mode="lines",
                             line=dict(dash="dash"), name="tokens/s at the floor"), 1, 2)
    for col in (1, 2):
        fig.update_xaxes(type="log", title_text="batch size (requests decoding together)",
                         tickvals=batch, row=1, col=col)
        fig.update_yaxes(type="log", row=1, col=col)
    fig.update_layout(title=title, height=420, legend=dict(orientation="h", y=-0.25))
    return fig


def occupancy_figure(results: list, title: str = ""):
    """Seats x steps for `toy_simulator.SimResult`s one above the other: a colour per request
    while it produces tokens, grey while a finished request still holds its seat, white when
    empty."""
    import plotly.colors
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    palette = plotly.colors.qualitative.Plotly  # the colours the engine views use
    # A discrete colour scale: value -1 (padding) is grey, value k is palette[k]; with zmin and
    # zmax half a step outside the values, each value lands in the middle of its own band.
    num_values = len(palette) + 1
    colorscale = []
    for value, color in enumerate(["#BBBBBB", *palette]):
        colorscale += [[value / num_values, color], [(value + 1) / num_values, color]]
    fig = make_subplots(
        rows=len(results), cols=1, shared_xaxes=True, vertical_spacing=0.25,
        subplot_titles=[
            f"{r.policy}: {r.num_steps} steps, {r.utilization:.0%} of seat-steps produce a token"
            for r in results
        ],
    )
    for row, result in enumerate(results, 1):
        grid = result.grid()
        # z: the request's colour index while it works, -1 while it pads, None (blank) if empty.
        z = [[None if c is None else (c[0] % len(palette) if c[1] else -1) for c in seat]
             for seat in grid]
        text = [
            ["" if c is None else f"request {c[0]}" + ("" if c[1] else " (finished, seat held)")
             for c in seat]
            for seat in grid
        ]
        fig.add_trace(
            go.Heatmap(z=z, text=text, zmin=-1.5, zmax=len(palette) - 0.5, colorscale=colorscale,
                       showscale=False, ygap=2,
                       hovertemplate="seat %{y}, step %{x}: %{text}<extra></extra>"),
            row, 1,
        )
        num_seats = len(grid)
        fig.update_yaxes(title_text="seat", autorange="reversed", tickvals=list(range(0, num_seats, max(1, num_seats // 8))),
                         row=row, col=1)
    # One step scale for every panel, each axis labelled: a run of fewer steps is a shorter bar.
    num_steps = max(r.num_steps for r in results)
    for row in range(1, len(results) + 1):
        fig.update_xaxes(title_text="decode step", range=[-0.5, num_steps - 0.5], showticklabels=True, row=row, col=1)
    fig.update_layout(title=title, height=250 * len(results) + 100, plot_bgcolor="white")
    return fig


def neighbours_figure(probes: list[ProbeLatency], title: str = ""):
    """The probe's TTFT and TPOT against how many other requests shared the engine."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    n = [p.num_others for p in probes]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time to first token (ms)",
                                                        "time per output token (ms)"))
    fig.add_trace(go.Bar(x=[str(k) for k in n], y=[p.ttft_s * 1e3 for p in probes],
                         name="TTFT"), 1, 1)
    fig.add_trace(go.Bar(x=[str(k) for k in n], y=[p.tpot_s * 1e3 for p in probes],
                         name="TPOT"), 1, 2)
    for col in (1, 2):
        fig.update_xaxes(title_text="other requests sharing the engine", row=1, col=col)
    fig.update_layout(title=title, height=380, showlegend=False)
    return fig


def context_sweep_figure(
    cost: DecodeCostModel,
    batch_sizes: list[int],
    context_lens: list[int],
    measured: list[ContextTiming] | None = None,
    title: str = "",
):
    """Step time relative to batch 1, against the batch, one line per context: the cost model's
    floors, and measured steps when given.  Where a line leaves 1, batching stops being free."""
    import plotly.graph_objects as go

    fig = go.Figure()
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for i, context in enumerate(context_lens):
        color = colors[i % len(colors)]
        fig.add_scatter(x=batch_sizes, y=[cost.slowdown(b, context) for b in batch_sizes], mode="lines",
                        line=dict(dash="dash", color=color), name=f"model, context {context:,}")
    for i, run in enumerate(measured or []):
        base = run.timings[0].step_s
        fig.add_scatter(x=[t.batch_size for t in run.timings], y=[t.step_s / base for t in run.timings],
                        mode="lines+markers", line=dict(color=colors[i % len(colors)]),
                        name=f"measured, context {run.context_len:,}")
    fig.update_xaxes(type="log", tickvals=batch_sizes, title_text="batch size")
    fig.update_yaxes(type="log", title_text="step time / step time at batch 1")
    fig.update_layout(title=title, height=420, legend=dict(orientation="h", y=-0.25))
    return fig
