"""Chapter 07's view of load over time: an overload is a transient, and how a client counts it.

Contract: every function reads the client's own timestamps of a `BenchResult` (`bench.serve`):
when each request was due (its place on the arrival clock), when it was really sent, when each
chunk came back.  Nothing here drives a server except `overload_runs` and
`closed_loop_at_rate`, which send traffic through `bench.serve` exactly as `minilm-engine bench
serve` does.

    request_frame        one row per request: due, sent, first and last token, in seconds of the run
    in_flight            how many requests are in the system (sent, not finished) at given times
    littles_law          L measured (time-averaged count in flight) against lambda x W
    ttft_slope           how fast TTFT grows with the time a request arrived (ms per second of run)
    overload_runs        the same traffic below, at and past capacity, for a fixed run length
    closed_loop_at_rate  an open-loop clock behind a cap on requests in flight (coordinated omission)
    transient_figure     TTFT of every request against its arrival time, and requests in flight

Why over time: past capacity the queue grows for as long as arrivals outpace departures, so the
TTFT of the last request depends on how long the run lasted.  A "P99 at rate r" from a short run
measures the run's length as much as the server (any queueing text, e.g. Harchol-Balter, *Performance Modeling and Design of Computer
Systems*, 2013).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minilm_engine.bench.datasets import noodle_requests
from minilm_engine.bench.serve import BenchConfig, BenchResult, arrival_offsets, run_benchmark
from minilm_engine.course.teaching.claims import Measurement


def _model_name(server) -> str:
    return server.served_name if hasattr(server, "served_name") else server.app.state.serving.served_model_names[0]


def request_frame(result: BenchResult) -> pd.DataFrame:
    """Per request, seconds after the run's start: `due` (its arrival on the clock), `sent`
    (when the client really sent it: later than `due` when a concurrency cap held it back),
    `first` and `last` token; and in ms, TTFT from the send (what a benchmark reports) and
    from the due time (what the user whose request it was waited)."""
    config = result.config
    due = arrival_offsets(len(result.results), config.request_rate, config.burstiness, config.seed)
    rows = []
    for offset, r in zip(due, result.results):
        if not r.success or not r.chunk_times:
            continue
        rows.append({"due s": float(offset), "sent s": r.sent_time - result.start_time,
                     "first s": r.chunk_times[0] - result.start_time, "last s": r.chunk_times[-1] - result.start_time})
    frame = pd.DataFrame(rows)
    frame["TTFT ms"] = 1e3 * (frame["first s"] - frame["sent s"])
    frame["TTFT from due ms"] = 1e3 * (frame["first s"] - frame["due s"])
    frame["E2E ms"] = 1e3 * (frame["last s"] - frame["sent s"])
    return frame


def in_flight(frame: pd.DataFrame, times) -> np.ndarray:
    """Requests sent and not yet finished at each of `times` (seconds of the run)."""
    t = np.asarray(times, dtype=float)[:, None]
    return ((frame["sent s"].to_numpy() <= t) & (t < frame["last s"].to_numpy())).sum(axis=1)


def littles_law(result: BenchResult, window: tuple[float, float] = (0.25, 0.75), num_samples: int = 400) -> dict:
    """Little's law, L = lambda x W, checked on one run in the middle of its arrivals (`window`:
    fractions of the span of send times, away from the empty start and the drain at the end).

    L: requests in flight, averaged over `num_samples` instants of the window.
    lambda: requests sent per second in the window.  W: mean time in the system (E2E) of the
    requests sent in the window.  The two sides agree in a steady state; when the queue grows
    through the window (overload), W of the requests sent there runs ahead of the L measured
    there, because each of them also waits for arrivals that came after the window's start."""
    frame = request_frame(result)
    span = frame["sent s"].max() - frame["sent s"].min()
    t0, t1 = (frame["sent s"].min() + f * span for f in window)
    inside = frame[(frame["sent s"] >= t0) & (frame["sent s"] < t1)]
    measured = float(in_flight(frame, np.linspace(t0, t1, num_samples)).mean())
    rate = len(inside) / (t1 - t0)
    mean_s = float(inside["E2E ms"].mean()) / 1e3
    return {"L measured": measured, "lambda req/s": rate, "W s": mean_s, "lambda x W": rate * mean_s,
            "requests in window": len(inside)}


def ttft_slope(frame: pd.DataFrame, column: str = "TTFT ms", label: str = "") -> Measurement:
    """The least-squares slope of `column` (ms) against the due time (s): ms of extra wait per
    second the run went on, with a bootstrap interval over requests.  About 0 in a steady state;
    positive while a queue grows."""
    points = list(zip(frame["due s"], frame[column]))

    def slope(items) -> float:
        x, y = np.array([p[0] for p in items]), np.array([p[1] for p in items])
        return float(np.polyfit(x, y, 1)[0]) if np.ptp(x) > 0 else 0.0

    return Measurement.bootstrap(points, slope, unit="ms/s", label=label or f"slope of {column} over the run")


def overload_runs(server, capacity: float, fractions: tuple[float, ...] = (0.7, 1.3), seconds: float = 10.0,
                  output_len: int = 32, seed: int = 0) -> dict[float, BenchResult]:
    """Poisson arrivals at each `fraction` x `capacity` req/s for `seconds` of arrivals (so the
    runs last as long, whatever their rate): {fraction: BenchResult}."""
    runs = {}
    for index, fraction in enumerate(fractions):
        rate = fraction * capacity
        requests = noodle_requests(max(4, int(rate * seconds)), output_len=output_len, seed=seed)
        config = BenchConfig(base_url=server.url, model=_model_name(server), request_rate=rate, ignore_eos=True,
                             seed=seed + 100 + index)
        runs[fraction] = run_benchmark(config, requests, progress=False)
    return runs


def closed_loop_at_rate(server, rate: float, max_concurrency: int, seconds: float = 10.0, output_len: int = 32,
                        seed: int = 0) -> BenchResult:
    """The arrival clock of an open loop at `rate`, behind a cap of `max_concurrency` requests in
    flight: a request due while the cap is full waits in the client, unsent and untimed.  Its
    TTFT from the send looks like an unloaded server's; from its due time it is what its user
    waited (coordinated omission: the load generator slows down with the server it measures)."""
    requests = noodle_requests(max(4, int(rate * seconds)), output_len=output_len, seed=seed)
    config = BenchConfig(base_url=server.url, model=_model_name(server), request_rate=rate,
                         max_concurrency=max_concurrency, ignore_eos=True, seed=seed + 200)
    return run_benchmark(config, requests, progress=False)


def transient_figure(frames: dict[str, pd.DataFrame], title: str = "", column: str = "TTFT ms") -> go.Figure:
    """Top: each request's TTFT (`column`) against the time it was due, one series per run.
    Bottom: requests in flight over the run.  A steady state is flat; an overload climbs for as
    long as the run lasts."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=("each request's TTFT by its arrival time", "requests in the system (sent, unfinished)"))
    colors = ("#3B75AF", "#EF8636", "#519E3E", "#C53A32")
    for (name, frame), color in zip(frames.items(), colors):
        fig.add_trace(go.Scatter(x=frame["due s"], y=frame[column], mode="markers", name=name,
                                 marker=dict(size=5, color=color)), row=1, col=1)
        end = float(frame["last s"].max())
        times = np.linspace(0.0, end, max(50, int(end * 20)))
        fig.add_trace(go.Scatter(x=times, y=in_flight(frame, times), mode="lines", name=f"{name}: in flight",
                                 line=dict(color=color)), row=2, col=1)
    fig.update_yaxes(title_text="TTFT (ms)", row=1, col=1)
    fig.update_yaxes(title_text="requests", row=2, col=1)
    fig.update_xaxes(title_text="seconds since the run started", row=2, col=1)
    fig.update_layout(title=title or "An overload is a transient", height=560)
    return fig
