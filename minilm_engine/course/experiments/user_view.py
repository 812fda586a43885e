"""Chapter 10's measurements beyond one server's HTTP view, and the chapter's figures.

Contract: each function measures one thing a user of a hosted model observes, on this package's
engine (or its real `RateLimiter`), and returns plain tables; the `*_figure` functions draw them
(plotly; static PNG in committed notebooks).

    gap_spread_ms         one request's jitter: the spread (P90 - P10) of its inter-token gaps
    jitter_table          that spread, request by request, at each background rate
    ttft_by_backend       TTFT of prompts of rising length on servers that differ only in their
                          attention backend, measured side by side (alternating, in one run)
    attention_seconds     one prefill's attention, written out (T x T scores) vs fused (SDPA)
    request_cost_s        server seconds one request costs, from a prefill fit and a decode gap
    retry_storm           clients refused together, retried three ways, against the real limiter
    throughput_by_batch   tokens/s and TPOT at each batch size: the batch tier's cost
    goodput_sweep         colocated replicas vs a prefill/decode pair on the same two devices:
                          requests/s per device meeting a TTFT and a TPOT SLO (DistServe's goodput)

The retry storm runs the package's `RateLimiter` on a simulated clock (the clients are
simulated, the limiter's arithmetic is the server's); the goodput sweep times each engine on
its own clock of measured steps (course/experiments/disaggregation.py explains that clock).
"""

from __future__ import annotations

import heapq
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from minilm_engine.bench.client import RetryPolicy, backoff_delay
from minilm_engine.bench.datasets import BenchRequest
from minilm_engine.bench.serve import BenchConfig
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.experiments import disaggregation
from minilm_engine.course.experiments.outside_view import ServerProcess, _interval, _send_one, _text_of_tokens
from minilm_engine.course.experiments.prefill import PrefillFit, corpus_token_ids
from minilm_engine.course.noodle_corpus import sample_prompts
from minilm_engine.distributed.kv_transfer import DisaggRouter
from minilm_engine.entrypoints.llm import LLM
from minilm_engine.entrypoints.rate_limit import RateLimiter, RateLimitExceeded, RateLimits
from minilm_engine.model.attention.reference import attention as reference_attention

# -- jitter: the spread of one user's gaps ---------------------------------------------------------


def gap_spread_ms(result) -> float:
    """One streamed request's jitter: P90 - P10 of its inter-token gaps, in ms."""
    gaps = np.asarray(result.itls) * 1e3
    return float(np.percentile(gaps, 90) - np.percentile(gaps, 10))


def jitter_table(probes_by_rate: dict, capacity: float) -> pd.DataFrame:
    """Per background rate: the median over the user's requests of each one's gap spread, and
    of its median gap (the level, which jitter is not)."""
    rows = []
    for rate, results in probes_by_rate.items():
        spreads = [gap_spread_ms(r) for r in results]
        levels = [1e3 * float(np.median(r.itls)) for r in results]
        rows.append({"background req/s": rate, "share of capacity": rate / capacity,
                     "gap spread P90-P10 ms (median)": statistics.median(spreads),
                     "gap spread min ms": min(spreads), "gap spread max ms": max(spreads),
                     "median gap ms": statistics.median(levels), "requests": len(results)})
    return pd.DataFrame(rows)


def jitter_figure(probes_by_rate: dict, capacity: float, title: str = "") -> go.Figure:
    """Left: every gap of the user's streams, one box per background load.  Right: each request's
    gap spread (P90 - P10) against the background load."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("every gap between two of your tokens",
                                                        "each request's spread, P90 - P10 of its gaps"))
    for rate, results in probes_by_rate.items():
        share = f"{rate / capacity:.0%} of capacity"
        gaps = [1e3 * g for r in results for g in r.itls]
        fig.add_trace(go.Box(y=gaps, name=share, boxpoints=False, showlegend=False), row=1, col=1)
    table = jitter_table(probes_by_rate, capacity)
    for rate, results in probes_by_rate.items():
        fig.add_trace(go.Scatter(x=[100 * rate / capacity] * len(results), y=[gap_spread_ms(r) for r in results],
                                 mode="markers", marker=dict(color="#999", size=6), showlegend=False), row=1, col=2)
    fig.add_trace(go.Scatter(x=100 * table["share of capacity"], y=table["gap spread P90-P10 ms (median)"],
                             mode="lines+markers", name="median over your requests"), row=1, col=2)
    fig.update_xaxes(title_text="background load", row=1, col=1)
    fig.update_yaxes(title_text="gap between tokens (ms, log)", type="log", row=1, col=1)
    fig.update_xaxes(title_text="background load (% of capacity)", row=1, col=2)
    fig.update_yaxes(title_text="P90 - P10 of one request's gaps (ms)", rangemode="tozero", row=1, col=2)
    fig.update_layout(title=title or "Jitter: the spread of your gaps as others' load rises below capacity", height=430)
    return fig


# -- long prompts: the attention's T x T term, written out or fused --------------------------------


def ttft_by_backend(servers: dict[str, ServerProcess], tokenizer, lengths: list[int], num_repeats: int = 5,
                    seed: int = 0) -> dict[str, pd.DataFrame]:
    """The TTFT of a prompt of each length on each server (one user, one request at a time, 2
    output tokens), measured side by side: in every repeat the lengths come in a rotating order
    and each length goes to every server in turn (the order of the servers alternating from one
    repeat to the next), so a slow moment of the machine falls on all of them alike.

    Each server first gets one prompt of the longest length, not counted (a fresh server's first
    prefill pays its warm-up).  Then each gets the same text for a (length, repeat) and no text
    twice, and /metrics shows that none found any of it in its prefix cache.  Returns, per server name, the table of
    `outside_view.ttft_by_prompt_length` (same columns, same attrs).
    """
    names = list(servers)
    configs = {name: BenchConfig(base_url=s.url, model=s.served_name, ignore_eos=True) for name, s in servers.items()}
    for name in names:  # one request each first, not counted: a fresh server's first prefill pays its warm-up
        _send_one(configs[name], BenchRequest(prompt="Warm-up:\n" + _text_of_tokens(tokenizer, max(lengths), seed=seed - 1),
                                              max_tokens=2))
    hits_before = {name: s.prefix_cache_hits() for name, s in servers.items()}
    times: dict[str, dict[int, list[float]]] = {name: {n: [] for n in lengths} for name in names}
    counted: dict[str, dict[int, int]] = {name: {} for name in names}
    for repeat in range(num_repeats):
        shift = repeat % len(lengths)
        order = names if repeat % 2 == 0 else names[::-1]
        for n in lengths[shift:] + lengths[:shift]:
            prompt = f"Order {seed}-{repeat}-{n}:\n" + _text_of_tokens(tokenizer, n, seed=seed + 7919 * repeat + n)
            for name in order:
                result = _send_one(configs[name], BenchRequest(prompt=prompt, max_tokens=2))
                times[name][n].append(result.ttft)
                counted[name][n] = result.num_prompt_tokens
    tables = {}
    for name, server in servers.items():
        rows = []
        for n in lengths:
            median, low, high = _interval(times[name][n])
            rows.append({"prompt tokens": counted[name][n], "TTFT p50 ms": 1000 * median, "TTFT min ms": 1000 * low,
                         "TTFT max ms": 1000 * high, "ms per prompt token": 1000 * median / counted[name][n]})
        table = pd.DataFrame(rows)
        table.attrs["prefix_cache_hit_tokens"] = server.prefix_cache_hits() - hits_before[name]
        table.attrs["ttft_seconds"] = {counted[name][n]: times[name][n] for n in lengths}
        tables[name] = table
    return tables


def attention_seconds(config, lengths: Sequence[int], num_repeats: int = 5) -> pd.DataFrame:
    """One prefill's attention for all layers of `config` (causal, its heads and head size, one
    sequence of T tokens): the engine's reference attention (backend "torch"), which writes the
    T x T scores, against torch's fused `scaled_dot_product_attention` (what the default CPU
    backend runs for a prompt: scores in tiles, never the whole square), the same inputs, alternating repeats, medians.  Float32, as the chef runs."""
    rows = []
    h, h_kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    gen = torch.Generator().manual_seed(0)
    for t in lengths:
        q = torch.randn(1, h, t, d, generator=gen)
        k = torch.randn(1, h_kv, t, d, generator=gen)
        v = torch.randn(1, h_kv, t, d, generator=gen)
        mask = torch.ones(t, t, dtype=torch.bool).tril()[None]
        k_rep, v_rep = k.repeat_interleave(h // h_kv, dim=1), v.repeat_interleave(h // h_kv, dim=1)
        ref_out = reference_attention(q, k, v, mask)
        fused_out = torch.nn.functional.scaled_dot_product_attention(q, k_rep, v_rep, is_causal=True)
        torch.testing.assert_close(fused_out, ref_out, rtol=1e-4, atol=1e-4)  # the same attention
        times: dict[str, list[float]] = {"reference": [], "fused": []}
        for _ in range(num_repeats):
            for name in ("reference", "fused"):
                start = time.perf_counter()
                if name == "reference":
                    reference_attention(q, k, v, mask)
                else:
                    torch.nn.functional.scaled_dot_product_attention(q, k_rep, v_rep, is_causal=True)
                times[name].append(time.perf_counter() - start)
        layers = config.num_hidden_layers
        rows.append({"prompt tokens": t,
                     "attention, writes T x T ms": 1e3 * layers * statistics.median(times["reference"]),
                     "attention, fused ms": 1e3 * layers * statistics.median(times["fused"]),
                     "score bytes MiB": layers * h * t * t * 4 / 2**20})
    return pd.DataFrame(rows)


def ttft_figure(ttft: pd.DataFrame, fit: PrefillFit, attention: pd.DataFrame, flop_crossover: float,
                title: str = "", reference: pd.DataFrame | None = None) -> go.Figure:
    """TTFT against prompt length (markers: median, bars: min-max): measured with the default attention, its fit
    and the fit's linear part; the same prompts' TTFT with the reference attention (`reference`,
    when given); and the attention alone, written out vs fused, on the same axes."""
    fig = go.Figure()
    t = ttft["prompt tokens"]

    def measured(table: pd.DataFrame, name: str) -> go.Scatter:
        return go.Scatter(x=table["prompt tokens"], y=table["TTFT p50 ms"], mode="markers", name=name,
                          error_y=dict(type="data", symmetric=False, array=table["TTFT max ms"] - table["TTFT p50 ms"],
                                       arrayminus=table["TTFT p50 ms"] - table["TTFT min ms"]))

    fig.add_trace(measured(ttft, "TTFT, default attention (SDPA)"))
    if reference is not None:
        fig.add_trace(measured(reference, "TTFT, reference (writes T x T)"))
    grid = np.linspace(0, float(t.max()) * 1.05, 80)
    fig.add_trace(go.Scatter(x=grid, y=1e3 * fit.predict(grid), mode="lines", name="fit (default): a + bT + cT^2"))
    fig.add_trace(go.Scatter(x=grid, y=1e3 * (fit.fixed + fit.linear * grid), mode="lines", line=dict(dash="dot"),
                             name="fit without its T^2 term"))
    fig.add_trace(go.Scatter(x=attention["prompt tokens"], y=attention["attention, writes T x T ms"],
                             mode="lines+markers", name="attention alone, writes T x T"))
    fig.add_trace(go.Scatter(x=attention["prompt tokens"], y=attention["attention, fused ms"], mode="lines+markers",
                             name="attention alone, fused (SDPA)"))
    fig.update_layout(title=title or f"TTFT by prompt length (the FLOP crossover of this model is at {flop_crossover:,.0f})",
                      xaxis_title="prompt tokens", yaxis_title="ms", height=450, legend=dict(x=0.01, y=0.99))
    return fig


# -- rate limits: what a request costs the server ----------------------------------------------------


def request_cost_s(fit: PrefillFit, decode_gap_s: float, prompt_tokens: int, output_tokens: int) -> float:
    """Server seconds one request takes alone: its prefill (the fit) plus one decode gap a token."""
    return float(fit.predict(prompt_tokens)) + output_tokens * decode_gap_s


# -- retries: synchronized, jittered, Retry-After honoured -------------------------------------------

RETRY_POLICIES = ("fixed backoff, no jitter", "full jitter", "Retry-After, no jitter", "Retry-After + full jitter")


@dataclass(frozen=True)
class StormResult:
    policy: str
    seed: int
    num_attempts: int
    num_refused: int
    last_admitted_s: float
    attempt_times_s: tuple[float, ...]


def retry_storm(policy: str, num_clients: int = 40, tokens_each: int = 100, tokens_per_period: int = 1000,
                period_s: float = 10.0, base_delay_s: float = 0.5, max_delay_s: float = 30.0,
                seed: int = 0) -> StormResult:
    """`num_clients` requests of `tokens_each` tokens arrive together on one key of the package's
    `RateLimiter` (a limit of `tokens_per_period` tokens per `period_s`); each refused client
    waits as `policy` says and tries again until admitted.  Simulated clock: an attempt takes no
    time, so what is counted is the retry policy alone."""
    if policy not in RETRY_POLICIES:
        raise ValueError(f"policy must be one of {RETRY_POLICIES}, got {policy!r}")
    now = [0.0]
    limiter = RateLimiter(RateLimits(tokens_per_minute=tokens_per_period), clock=lambda: now[0], period_s=period_s)
    rng = random.Random(seed)
    queue = [(0.0, i, 0) for i in range(num_clients)]  # (time, client, retry number)
    heapq.heapify(queue)
    attempts, refused, last = [], 0, 0.0
    while queue:
        at, client, retry = heapq.heappop(queue)
        now[0] = at
        attempts.append(at)
        try:
            limiter.admit("org", tokens_each)
            last = at
        except RateLimitExceeded as refusal:
            refused += 1
            cap = min(max_delay_s, base_delay_s * 2**retry)
            retry_after = refusal.retry_after_s or 0.0
            if policy == "fixed backoff, no jitter":
                wait = cap
            elif policy == "full jitter":
                wait = rng.uniform(0.0, cap)
            elif policy == "Retry-After, no jitter":
                wait = retry_after
            else:  # the package's client (bench/client.py: backoff_delay)
                wait = backoff_delay(RetryPolicy(base_delay_s=base_delay_s, max_delay_s=max_delay_s), retry,
                                     retry_after, rng)
            heapq.heappush(queue, (at + wait, client, retry + 1))
    return StormResult(policy, seed, len(attempts), refused, last, tuple(attempts))


def retry_table(results: Sequence[StormResult]) -> pd.DataFrame:
    rows = []
    for policy in RETRY_POLICIES:
        runs = [r for r in results if r.policy == policy]
        if not runs:
            continue
        refused = [r.num_refused for r in runs]
        done = [r.last_admitted_s for r in runs]
        rows.append({"policy": policy, "seeds": len(runs), "429s (median)": statistics.median(refused),
                     "429s min": min(refused), "429s max": max(refused),
                     "all admitted after s (median)": statistics.median(done),
                     "min s": min(done), "max s": max(done)})
    return pd.DataFrame(rows)


def retry_figure(results: Sequence[StormResult], bin_s: float = 1.0, title: str = "") -> go.Figure:
    """Attempts per time bin (one seed each): a synchronized client population comes back in waves."""
    fig = go.Figure()
    horizon = max(max(r.attempt_times_s) for r in results)
    edges = np.arange(0.0, horizon + 2 * bin_s, bin_s)
    for policy in RETRY_POLICIES:
        run = next((r for r in results if r.policy == policy), None)
        if run is None:
            continue
        counts, _ = np.histogram(run.attempt_times_s, bins=edges)
        fig.add_trace(go.Scatter(x=edges[:-1], y=counts, mode="lines", line_shape="hv", name=policy))
    fig.update_layout(title=title or "Attempts reaching the server after a spike is refused",
                      xaxis_title=f"seconds since the spike ({bin_s:g} s bins)", yaxis_title="attempts per bin",
                      height=400)
    return fig


# -- the batch tier: the cost of a token at the operating point each tier may use --------------------


def throughput_by_batch(llm: LLM, batch_sizes: Sequence[int], output_len: int = 32,
                        num_repeats: int = 3) -> pd.DataFrame:
    """B requests decoded together (their prompts first), for each B in `batch_sizes`, alternating
    batch sizes in each repeat: output tokens/s and the TPOT of the batch (decode time / tokens
    after the first), medians and ranges over repeats, in CPU seconds of this process."""
    engine = llm.engine
    prompts = [llm.tokenizer.encode(p) for p in sample_prompts(max(batch_sizes), 3)]
    timer = disaggregation.step_timer(llm)
    runs: dict[int, list[tuple[float, float]]] = {b: [] for b in batch_sizes}
    for repeat in range(num_repeats + 1):  # the first round warms up and is dropped
        for b in batch_sizes:
            engine.block_pool.reset_prefix_cache()
            for j in range(b):
                params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
                engine.add_request(f"tb-{repeat}-{b}-{j}", {"prompt_token_ids": prompts[j]}, params)
            start = timer()
            engine.step_requests()  # the prompts (and first tokens)
            decode_start = timer()
            while engine.has_unfinished_requests():
                engine.step_requests()
            end = timer()
            if repeat:
                runs[b].append((b * output_len / (end - start), (end - decode_start) / (output_len - 1)))
    rows = []
    for b, values in runs.items():
        tps, tpot = [v[0] for v in values], [1e3 * v[1] for v in values]
        rows.append({"batch": b, "output tok/s": statistics.median(tps), "tok/s min": min(tps), "tok/s max": max(tps),
                     "TPOT ms": statistics.median(tpot), "TPOT min ms": min(tpot), "TPOT max ms": max(tpot)})
    table = pd.DataFrame(rows)
    table.attrs["runs"] = runs
    return table


def tier_costs(table: pd.DataFrame, tpot_slo_ms: float, dollars_per_hour: float) -> dict:
    """Cost per million output tokens at the largest batch that meets the TPOT SLO (interactive)
    and at the batch of highest throughput (a batch tier, no latency target); the discount."""
    meets = table[table["TPOT ms"] <= tpot_slo_ms]
    if meets.empty:
        raise ValueError(f"no batch size meets a TPOT of {tpot_slo_ms} ms")
    interactive = meets.loc[meets["output tok/s"].idxmax()]
    batch = table.loc[table["output tok/s"].idxmax()]

    def per_mtok(tps: float) -> float:
        return dollars_per_hour / (tps * 3600) * 1e6

    return {"interactive batch": int(interactive["batch"]), "interactive tok/s": float(interactive["output tok/s"]),
            "interactive $/Mtok": per_mtok(float(interactive["output tok/s"])),
            "batch-tier batch": int(batch["batch"]), "batch-tier tok/s": float(batch["output tok/s"]),
            "batch-tier $/Mtok": per_mtok(float(batch["output tok/s"])),
            "discount": 1 - float(interactive["output tok/s"]) / float(batch["output tok/s"])}


def batch_cost_figure(table: pd.DataFrame, tpot_slo_ms: float, dollars_per_hour: float, title: str = "") -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TPOT each request sees", "cost of a million output tokens"))
    fig.add_trace(go.Scatter(x=table["batch"], y=table["TPOT ms"], mode="lines+markers", name="TPOT (median)",
                             error_y=dict(type="data", symmetric=False, array=table["TPOT max ms"] - table["TPOT ms"],
                                          arrayminus=table["TPOT ms"] - table["TPOT min ms"])), row=1, col=1)
    fig.add_trace(go.Scatter(x=[table["batch"].min(), table["batch"].max()], y=[tpot_slo_ms] * 2, mode="lines",
                             line=dict(dash="dash", color="#c33"), name=f"interactive TPOT SLO {tpot_slo_ms:.0f} ms"),
                  row=1, col=1)
    cost = dollars_per_hour / (table["output tok/s"] * 3600) * 1e6
    fig.add_trace(go.Scatter(x=table["batch"], y=cost, mode="lines+markers", name="$ per Mtok"), row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(title_text="requests decoded together (batch)", type="log", row=1, col=col)
    fig.update_yaxes(title_text="ms per output token", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text=f"$ per Mtok at ${dollars_per_hour:.2f} per machine-hour", type="log", row=1, col=2)
    fig.update_layout(title=title or "What a latency target costs: the same machine at the batch each tier may use",
                      height=420)
    return fig


# -- disaggregation vs two colocated replicas: goodput per device ----------------------------------


@dataclass(frozen=True)
class GoodputWorkload:
    """Poisson arrivals of short chat prompts and long document prompts (a share of them), each
    making `output_len` tokens (own seed, EOS ignored: every configuration computes the same)."""

    num_requests: int = 32
    long_share: float = 0.25
    long_prompt_tokens: int = 512
    output_len: int = 32
    seed: int = 0

    def arrivals(self, tokenizer, rate: float) -> list[disaggregation.Arrival]:
        rng = random.Random(self.seed)
        shorts = sample_prompts(self.num_requests, self.seed)
        num_long = max(1, round(self.long_share * self.num_requests))
        long_ids = corpus_token_ids(tokenizer, self.long_prompt_tokens * num_long, self.seed)
        is_long = [False] * self.num_requests
        for i in rng.sample(range(self.num_requests), num_long):
            is_long[i] = True
        out, clock, j = [], 0.0, 0
        for i in range(self.num_requests):
            clock += rng.expovariate(rate) if i else 0.0
            if is_long[i]:
                ids = long_ids[j * self.long_prompt_tokens:(j + 1) * self.long_prompt_tokens]
                j += 1
            else:
                ids = tokenizer.encode(shorts[i], add_special_tokens=True)
            params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=self.output_len, ignore_eos=True,
                                    seed=1000 * self.seed + i)
            out.append(disaggregation.Arrival(f"{'l' if is_long[i] else 's'}{i}", clock, ids, params))
        return out


def _per_request(run: disaggregation.Run) -> list[tuple[float, float]]:
    """(TTFT s, TPOT s) of each request of a run."""
    out = []
    for rid, times in run.token_times_s.items():
        ttft = times[0] - run.arrival_s[rid]
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
        out.append((ttft, tpot))
    return out


def run_replicas(llm: LLM, arrivals: Sequence[disaggregation.Arrival], num_replicas: int, run_id: str):
    """`num_replicas` copies of one engine, each its own device: arrivals dealt round-robin, each
    replica stepped on its own clock.  Returns ([(TTFT, TPOT)], device-seconds, makespan)."""
    results, device_s, makespan = [], 0.0, 0.0
    for k in range(num_replicas):
        run = disaggregation.run_one_engine(llm, arrivals[k::num_replicas], "replica", f"{run_id}-{k}")
        results += _per_request(run)
        device_s += run.device_s
        makespan = max(makespan, max(t[-1] for t in run.token_times_s.values()))
    return results, device_s, makespan


def goodput_sweep(model: str | None, workload: GoodputWorkload, rates_per_device: Sequence[float],
                  chunk_sizes: Sequence[int], slo_ttft_s: float, slo_tpot_s: float, device: str | None = None,
                  max_num_seqs: int = 16, num_repeats: int = 1) -> pd.DataFrame:
    """On two devices at each rate per device: two colocated replicas with whole prompts, two
    with chunked prefill at each chunk size, and one prefill + one decode engine (the KV copied
    between them).  One row per (configuration, rate, repeat): the share of requests meeting
    both SLOs, goodput per device (those requests / makespan / 2), TTFT P90 and TPOT P90.
    Configurations alternate at each rate; repeat r uses arrivals of seed workload.seed + r."""
    common = dict(device=device, max_num_seqs=max_num_seqs, record_trace=False)
    systems: dict[str, object] = {}
    chunked = {c: LLM(model, **common, enable_chunked_prefill=True, max_num_batched_tokens=c) for c in chunk_sizes}
    probe = next(iter(chunked.values())) if chunked else LLM(model, **common)
    whole_budget = dict(enable_chunked_prefill=False, max_num_batched_tokens=probe.max_model_len)
    whole = LLM(model, **common, **whole_budget)
    systems["2 replicas, whole prompts"] = whole
    for c, llm in chunked.items():
        systems[f"2 replicas, chunks of {c}"] = llm
    systems["1 prefill + 1 decode"] = DisaggRouter.from_model(model, **common, prefill=whole_budget)
    tokenizer = whole.tokenizer
    rows = []
    for repeat in range(num_repeats):
        load = GoodputWorkload(**{**workload.__dict__, "seed": workload.seed + repeat})
        for rate in rates_per_device:
            arrivals = load.arrivals(tokenizer, 2 * rate)  # two devices' worth of traffic
            for label, system in systems.items():
                run_id = f"g{repeat}-{rate}-{label}"
                if isinstance(system, LLM):
                    per_request, device_s, makespan = run_replicas(system, arrivals, 2, run_id)
                else:
                    run = disaggregation.run_disaggregated(system, arrivals, label, run_id)
                    per_request, device_s = _per_request(run), run.device_s
                    makespan = max(t[-1] for t in run.token_times_s.values())
                ok = sum(1 for ttft, tpot in per_request if ttft <= slo_ttft_s and tpot <= slo_tpot_s)
                ttfts, tpots = sorted(p[0] for p in per_request), sorted(p[1] for p in per_request)
                rows.append({"config": label, "rate per device": rate, "repeat": repeat,
                             "SLO met %": 100 * ok / len(per_request),
                             "goodput per device req/s": ok / makespan / 2,
                             "TTFT p90 ms": 1e3 * disaggregation.percentile(ttfts, 90),
                             "TPOT p90 ms": 1e3 * disaggregation.percentile(tpots, 90),
                             "device-seconds": device_s, "requests": len(per_request)})
    return pd.DataFrame(rows)


def goodput_figure(table: pd.DataFrame, slo_text: str, title: str = "") -> go.Figure:
    """Left: SLO attainment against the rate per device, per configuration.  Right: at the highest
    rate, attainment by chunk size, with whole prompts and the disaggregated pair beside it."""
    mean = table.groupby(["config", "rate per device"], sort=False)["SLO met %"].median().reset_index()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("requests meeting both SLOs, by load",
                                                        "at the highest load: the chunk size"))
    for config in mean["config"].unique():
        part = mean[mean["config"] == config]
        fig.add_trace(go.Scatter(x=part["rate per device"], y=part["SLO met %"], mode="lines+markers", name=config),
                      row=1, col=1)
    top = mean[mean["rate per device"] == mean["rate per device"].max()]
    fig.add_trace(go.Bar(x=top["config"].str.replace("2 replicas, ", ""), y=top["SLO met %"], showlegend=False,
                         marker_color="#3B75AF"), row=1, col=2)
    fig.add_trace(go.Scatter(x=[mean["rate per device"].min(), mean["rate per device"].max()], y=[90, 90],
                             mode="lines", line=dict(dash="dash", color="#c33"), name="90% attainment"), row=1, col=1)
    fig.update_xaxes(title_text="arrivals per second per device (2 devices)", row=1, col=1)
    fig.update_yaxes(title_text=f"% of requests meeting {slo_text}", range=[0, 105], row=1, col=1)
    fig.update_xaxes(title_text="configuration", tickangle=-30, row=1, col=2)
    fig.update_yaxes(title_text="% meeting both SLOs", range=[0, 105], row=1, col=2)
    fig.update_layout(title=title or "Goodput on the same two devices: colocated replicas vs a prefill/decode pair",
                      height=470)
    return fig


def highest_rate_meeting(table: pd.DataFrame, config: str, attainment: float = 90.0) -> float:
    """The highest rate per device of the sweep at which `config`'s median attainment is at least
    `attainment` percent (0.0 if none): DistServe's goodput per device, read off the grid."""
    part = table[table["config"] == config].groupby("rate per device")["SLO met %"].median()
    ok = part[part >= attainment]
    return float(ok.index.max()) if len(ok) else 0.0


def context_figure(rows: Sequence[dict], concurrencies: Sequence[int], title: str = "") -> go.Figure:
    """For each model: the cap on any one request (flat: concurrency does not lower it) and the
    longest context that `C` requests can all hold at once (falls as 1/C)."""
    fig = go.Figure()
    palette = ("#3B75AF", "#E1812C", "#3A923A", "#C03D3E")
    for row, color in zip(rows, palette):
        fig.add_trace(go.Scatter(x=list(concurrencies), y=[row["cap"]] * len(concurrencies), mode="lines",
                                 line=dict(color=color, dash="dash"), name=f"{row['model']}: cap on one request"))
        fig.add_trace(go.Scatter(x=list(concurrencies), y=row["all at once"], mode="lines+markers",
                                 line=dict(color=color), name=f"{row['model']}: each of C requests, all at once"))
    fig.update_layout(title=title or "One request's cap vs what C requests can hold at once",
                      xaxis_title="concurrent requests C (log)", yaxis_title="context tokens (log)",
                      xaxis_type="log", yaxis_type="log", height=450)
    return fig



# -- the context cap: one long request among many ----------------------------------------------------


def long_request_among_others(server, tokenizer, prompt_tokens: int, max_tokens: int, num_others: int = 8,
                              other_max_tokens: int = 64) -> pd.DataFrame:
    """`num_others` short streams and one long request sent together to `server` (a
    `ServerProcess`): one row per request, with the HTTP status the server answered."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from minilm_engine.course.experiments.prefill import corpus_token_ids as ids_of

    long_text = tokenizer.decode(ids_of(tokenizer, prompt_tokens, seed=5))
    jobs = [("short", text, other_max_tokens) for text in sample_prompts(num_others, 4)]
    jobs.append(("long", long_text, max_tokens))

    def send(job):
        kind, text, limit = job
        reply = httpx.post(server.url + "/v1/completions", timeout=300,
                           json={"model": server.served_name, "prompt": text, "max_tokens": limit, "ignore_eos": True})
        body = reply.json()
        usage = body.get("usage") or {}
        return {"request": kind, "prompt tokens": usage.get("prompt_tokens"), "max_tokens": limit,
                "HTTP": reply.status_code, "output tokens": usage.get("completion_tokens"),
                "error": (body.get("error") or {}).get("message", "")[:90]}

    with ThreadPoolExecutor(len(jobs)) as pool:
        rows = list(pool.map(send, jobs))
    return pd.DataFrame(rows)
