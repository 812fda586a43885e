"""Chapter 07's measurements: load tests against a live server, as tables and figures.

Contract: every function drives a running server (`entrypoints.openai.ServerThread`) through
`bench.serve` only, over HTTP, exactly as `minilm-engine bench serve` would, and returns plain
pandas tables (one row per configuration) that the figures below draw.

    rate_sweep            the same traffic at rising request rates   -> the throughput-latency knee
    max_num_seqs_dial     one closed-loop load, batch limit 1 ... N    -> tokens/s vs latency each
    latency_under_load    one user's requests while background traffic grows
    streaming_vs_not      when the user first sees text: TTFT (streamed) or the whole answer
    speculation_at_load   speculative decoding on and off, for one user alone and under load
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import httpx
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..bench.datasets import noodle_requests
from ..bench.metrics import RequestResult, summarize
from ..bench.serve import BenchConfig, BenchResult, run_benchmark, run_benchmark_async, run_sync, send_request
from ..entrypoints.openai import ServerThread
from ..llm import LLM


def start_server(model: str | None = None, device: str | None = None, **engine_args) -> ServerThread:
    """An `LLM` (no step trace: a server runs long) behind a server on a free loopback port."""
    llm = LLM(model, device=device, record_trace=False, **engine_args)
    return ServerThread(llm).start()


def model_name(server) -> str:
    """The name the server answers to (the model as it was given, like vLLM's), for an
    in-process `ServerThread` or a `ServerProcess` (experiments/outside_view.py)."""
    if hasattr(server, "served_name"):
        return server.served_name
    return server.app.state.serving.served_model_names[0]


def arrival_rate(result: BenchResult) -> float:
    """The rate requests were really sent at: a Poisson draw of a few dozen gaps can be well
    off its nominal rate, so "did the server keep up" compares with this."""
    if math.isinf(result.config.request_rate):
        return math.inf  # all due at once
    sent = sorted(r.sent_time for r in result.results)
    span = sent[-1] - sent[0]
    return (len(sent) - 1) / span if span > 0 else math.inf


def _row(label: dict, result: BenchResult) -> dict:
    m = result.metrics
    return {**label, "sent req/s": arrival_rate(result), "achieved req/s": m.request_throughput, "output tok/s": m.output_throughput,
            "TTFT p50 ms": m.ttft_ms.median, "TTFT p99 ms": m.ttft_ms.p99, "TTFT mean ms": m.ttft_ms.mean,
            "ITL p50 ms": m.itl_ms.median, "ITL p99 ms": m.itl_ms.p99, "TPOT p50 ms": m.tpot_ms.median,
            "E2E p50 ms": m.e2el_ms.median, "E2E p99 ms": m.e2el_ms.p99, "goodput req/s": m.goodput,
            "completed": m.num_completed, "failed": m.num_failed}


def rate_sweep(server: ServerThread, rates: list[float], output_len: int = 32, seconds_per_rate: float = 8.0,
               min_requests: int = 16, max_requests: int = 96, slo: dict[str, float] | None = None,
               seed: int = 0) -> tuple[pd.DataFrame, list[BenchResult]]:
    """The same kind of traffic (Poisson arrivals, greedy, exactly `output_len` tokens each) at
    each rate, about `seconds_per_rate` of arrivals each (bounded by min/max_requests).  Every
    rate draws from the same prompts (`seed`), and its arrival gaps from its own seed (`seed` +
    its index): with one seed, every rate would replay the same gap pattern scaled, and a burst
    in it would hit every rate at the same place."""
    rows, results = [], []
    for index, rate in enumerate(rates):
        n = max_requests if math.isinf(rate) else int(min(max_requests, max(min_requests, rate * seconds_per_rate)))
        requests = noodle_requests(n, output_len=output_len, seed=seed)
        config = BenchConfig(base_url=server.url, model=model_name(server), request_rate=rate, ignore_eos=True,
                             slo=dict(slo or {}), seed=seed + index)
        result = run_benchmark(config, requests, progress=False)
        results.append(result)
        rows.append(_row({"offered req/s": rate, "requests": n}, result))
    return pd.DataFrame(rows), results


def knee(table: pd.DataFrame, keep_up: float = 0.9) -> pd.Series:
    """The row of the highest finite rate the server still kept up with (achieved >= `keep_up`
    x the rate requests were sent at): past it, requests arrive faster than they leave and
    queues grow.  The lowest rate when it kept up with none."""
    finite = table[table["offered req/s"].map(math.isfinite)]
    kept = finite[finite["achieved req/s"] >= keep_up * finite["sent req/s"]]
    return kept.iloc[-1] if len(kept) else finite.iloc[0]


def max_num_seqs_dial(model: str | None, device: str | None, values: list[int], num_requests: int = 32,
                      output_len: int = 16, concurrency: int = 32, num_runs: int = 1, seed: int = 0) -> pd.DataFrame:
    """For each `max_num_seqs`, a fresh server under the same closed loop of `concurrency`
    clients: total tokens/s against the latency each request sees (the fastest of `num_runs`)."""
    rows = []
    requests = noodle_requests(num_requests, output_len=output_len, seed=seed)
    for value in values:
        server = start_server(model, device, max_num_seqs=value)
        try:
            config = BenchConfig(base_url=server.url, model=model_name(server), max_concurrency=concurrency,
                                 ignore_eos=True, seed=seed)
            run_benchmark(replace(config, max_concurrency=2), requests[:2], progress=False)  # warm up
            # Keep the run least disturbed by other programs on the machine: the fastest.
            runs = [run_benchmark(config, requests, progress=False) for _ in range(num_runs)]
            best = min(runs, key=lambda r: r.metrics.duration_s)
            rows.append(_row({"max_num_seqs": value}, best))
        finally:
            server.stop()
    return pd.DataFrame(rows)


def latency_under_load(server: ServerThread, background_rates: list[float], num_probes: int = 6,
                       output_len: int = 32, background_seconds: float = 8.0, seed: int = 0) -> pd.DataFrame:
    """One user sends `num_probes` requests one after another while background traffic arrives
    at each rate (0 = the user alone): the user's own TTFT and ITL, by background rate.
    `table.attrs["probe_results"][rate]` keeps the user's `RequestResult`s."""
    name = model_name(server)
    probe_config = BenchConfig(base_url=server.url, model=name, ignore_eos=True)
    probes = noodle_requests(num_probes, output_len=output_len, seed=seed + 1)
    rows, probes_by_rate = [], {}
    for rate in background_rates:
        num_bg = int(rate * background_seconds)
        background = noodle_requests(max(num_bg, 1), output_len=output_len, seed=seed)
        bg_config = BenchConfig(base_url=server.url, model=name, request_rate=rate if rate > 0 else 1.0,
                                ignore_eos=True, seed=seed)

        async def both(num_bg=num_bg, bg_config=bg_config, background=background):  # bound now, run now
            async def probe_user() -> list[RequestResult]:
                out = []
                async with httpx.AsyncClient(timeout=600) as client:
                    for request in probes:
                        out.append(await send_request(client, probe_config, request))
                return out

            if num_bg == 0:
                return await probe_user(), None
            # The background starts first, so the user meets traffic already in flight.
            bg_task = asyncio.create_task(run_benchmark_async(bg_config, background, progress=False))
            await asyncio.sleep(min(1.0, background_seconds / 4))
            probe_results = await probe_user()
            return probe_results, await bg_task

        probe_results, bg = run_sync(both())
        probes_by_rate[rate] = probe_results
        m = summarize(probe_results, sum((r.e2e_latency or 0) for r in probe_results) or 1.0)
        rows.append({"background req/s": rate,
                     "background achieved req/s": bg.metrics.request_throughput if bg else 0.0,
                     "your TTFT p50 ms": m.ttft_ms.median, "your TTFT max ms": 1000 * max(r.ttft for r in probe_results),
                     "your ITL p50 ms": m.itl_ms.median, "your ITL p99 ms": m.itl_ms.p99,
                     "your E2E p50 ms": m.e2el_ms.median})
    table = pd.DataFrame(rows)
    # The user's requests, as the client saw them (the same prompts, in the same order, at every
    # rate): for paired comparisons request by request.
    table.attrs["probe_results"] = probes_by_rate
    return table


def streaming_vs_not(server: ServerThread, rate: float, num_requests: int = 24, output_len: int = 32,
                     seed: int = 0) -> pd.DataFrame:
    """The same requests streamed and not: when the user first sees any text."""
    requests = noodle_requests(num_requests, output_len=output_len, seed=seed)
    rows = []
    for stream in (True, False):
        config = BenchConfig(base_url=server.url, model=model_name(server), request_rate=rate, stream=stream,
                             ignore_eos=True, seed=seed)
        m = run_benchmark(config, requests, progress=False).metrics
        rows.append({"mode": "streamed" if stream else "whole answer", "first text p50 ms": m.ttft_ms.median,
                     "first text p99 ms": m.ttft_ms.p99, "last text p50 ms": m.e2el_ms.median,
                     "output tok/s": m.output_throughput})
    return pd.DataFrame(rows)


def speculation_at_load(model: str | None, device: str | None, speculative_config: dict, num_requests: int = 16,
                        output_len: int = 32, busy_concurrency: int = 16, seed: int = 0) -> pd.DataFrame:
    """Speculative decoding off and on (a fresh server each), measured for one user alone (one
    request at a time) and for a busy server (`busy_concurrency` clients in a closed loop).
    TPOT, not ITL, compares them: a speculative step can stream several tokens in one chunk."""
    requests = noodle_requests(num_requests, output_len=output_len, seed=seed)
    rows = []
    for label, engine_args in (("off", {}), (f"on (K={speculative_config['num_speculative_tokens']})",
                                             {"speculative_config": speculative_config})):
        server = start_server(model, device, max_num_seqs=max(16, busy_concurrency), **engine_args)
        try:
            config = BenchConfig(base_url=server.url, model=model_name(server), ignore_eos=True, seed=seed)
            run_benchmark(replace(config, max_concurrency=1), requests[:1], progress=False)  # warm up
            for load, concurrency in (("one user", 1), (f"{busy_concurrency} users", busy_concurrency)):
                m = run_benchmark(replace(config, max_concurrency=concurrency), requests, progress=False).metrics
                rows.append({"speculation": label, "load": load, "TPOT p50 ms": m.tpot_ms.median,
                             "E2E p50 ms": m.e2el_ms.median, "output tok/s": m.output_throughput})
        finally:
            server.stop()
    return pd.DataFrame(rows)


# -- figures --------------------------------------------------------------------------------------


def sweep_figure(table: pd.DataFrame, title: str = "") -> go.Figure:
    """Left: achieved vs offered rate (the server keeps up until it cannot).  Right: TTFT and ITL,
    P50 and P99, against the throughput achieved: the knee."""
    finite = table[table["offered req/s"].map(math.isfinite)]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("throughput: achieved vs offered",
                                                        "latency vs throughput (log scale)"))
    top = max(finite["offered req/s"].max(), table["achieved req/s"].max()) * 1.05
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", line=dict(dash="dot", color="#999"),
                             name="achieved = offered"), row=1, col=1)
    fig.add_trace(go.Scatter(x=finite["offered req/s"], y=finite["achieved req/s"], mode="lines+markers",
                             name="achieved req/s"), row=1, col=1)
    for column, dash in (("TTFT p50 ms", "solid"), ("TTFT p99 ms", "dash"), ("ITL p50 ms", "solid"),
                         ("ITL p99 ms", "dash")):
        fig.add_trace(go.Scatter(x=table["output tok/s"], y=table[column], mode="lines+markers", name=column,
                                 line=dict(dash=dash)), row=1, col=2)
    fig.update_xaxes(title_text="offered req/s", row=1, col=1)
    fig.update_yaxes(title_text="achieved req/s", row=1, col=1)
    fig.update_xaxes(title_text="output tokens/s (achieved)", row=1, col=2)
    fig.update_yaxes(title_text="ms", type="log", row=1, col=2)
    fig.update_layout(title=title or "The same traffic at rising request rates", height=430)
    return fig


def dial_figure(table: pd.DataFrame, title: str = "") -> go.Figure:
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=table["max_num_seqs"].astype(str), y=table["output tok/s"], name="output tok/s",
                         marker_color="#3B75AF", opacity=0.7), secondary_y=False)
    for column in ("ITL p50 ms", "E2E p50 ms"):
        fig.add_trace(go.Scatter(x=table["max_num_seqs"].astype(str), y=table[column], mode="lines+markers",
                                 name=column), secondary_y=True)
    fig.update_xaxes(title_text="max_num_seqs")
    fig.update_yaxes(title_text="output tokens/s (everyone)", secondary_y=False)
    fig.update_yaxes(title_text="ms (each request)", type="log", secondary_y=True)
    fig.update_layout(title=title or "max_num_seqs: total throughput vs each request's latency", height=420)
    return fig


def load_figure(table: pd.DataFrame, title: str = "") -> go.Figure:
    fig = go.Figure()
    for column in ("your TTFT p50 ms", "your ITL p50 ms", "your ITL p99 ms"):
        fig.add_trace(go.Scatter(x=table["background req/s"], y=table[column], mode="lines+markers", name=column))
    fig.update_layout(title=title or "Your latency while others' traffic grows", xaxis_title="background req/s",
                      yaxis_title="ms", yaxis_type="log", height=400)
    return fig
