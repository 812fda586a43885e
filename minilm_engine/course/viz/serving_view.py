"""Requests arriving, queueing, running and finishing over time, as a server sees them.

Contract: `ServingView.follow(async_engine)` records every request the server's engine takes
(through its `on_request_added` hook); `figure()` draws them as they are now, from their own
timestamps (`Request.metrics`), and `watch(fn)` runs `fn` (a load test) on a worker thread while
a live FigureWidget redraws from this thread, or, without a widget frontend
(`MINILM_STATIC_FIGURES=1`), runs it and shows the final figure.

    request ▲  ····▒▒██████████            · queued (arrived, not yet scheduled)
            │    ··▒▒█████████████         ▒ prefill (scheduled, no token yet)
            │       ·······▒▒████████×     █ decode (streaming tokens)   × aborted
            └──────────────────────────▶ seconds
    running / waiting   ▁▂▄▆██▆▄▂            how many were in each state at each moment

A request preempted and recomputed shows as one long run: a request's metrics keep its first
scheduling time only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

QUEUE_COLOR = "#BBBBBB"
PREFILL_COLOR = "#F2A541"
DECODE_COLOR = "#3B75AF"
ABORT_COLOR = "#C0392B"


@dataclass(frozen=True)
class RequestSpan:
    """One request's life in seconds after `t0` (None: not reached yet)."""

    request_id: str
    arrival: float
    scheduled: float | None
    first_token: float | None
    end: float | None
    aborted: bool


def request_spans(requests: list, t0: float | None = None) -> list[RequestSpan]:
    """Spans of `Request`s, in arrival order, times relative to `t0` (default: first arrival)."""
    requests = sorted(requests, key=lambda r: r.metrics.arrival_time)
    if not requests:
        return []
    t0 = requests[0].metrics.arrival_time if t0 is None else t0

    def rel(t):
        return None if t is None else t - t0

    return [RequestSpan(r.request_id, r.metrics.arrival_time - t0, rel(r.metrics.first_scheduled_time),
                        rel(r.metrics.first_token_time), rel(r.metrics.finished_time),
                        r.finish_reason == "abort") for r in requests]


def occupancy(spans: list[RequestSpan], now: float) -> tuple[list[float], list[int], list[int]]:
    """(times, waiting, running): how many requests were queued and how many scheduled, after
    each event up to `now` (a step function)."""
    events: list[tuple[float, int, int]] = []  # (time, d_waiting, d_running)
    for s in spans:
        events.append((s.arrival, 1, 0))
        if s.scheduled is not None:
            events.append((s.scheduled, -1, 1))
            if s.end is not None:
                events.append((s.end, 0, -1))
        elif s.end is not None:  # aborted while still queued
            events.append((s.end, -1, 0))
    events.sort()
    times, waiting, running = [0.0], [0], [0]
    for t, dw, dr in events:
        times.append(t)
        waiting.append(waiting[-1] + dw)
        running.append(running[-1] + dr)
    times.append(max(now, times[-1]))
    waiting.append(waiting[-1])
    running.append(running[-1])
    return times, waiting, running


class ServingView:
    def __init__(self, title: str = "Requests over time"):
        self.requests: list = []  # appended on the engine thread; read here (list ops are atomic)
        self.title = title
        self.t0: float | None = None

    def follow(self, async_engine) -> ServingView:
        """Record every request `async_engine` takes from now on."""
        async_engine.on_request_added = self.requests.append
        return self

    def clear(self) -> None:
        self.requests.clear()
        self.t0 = None

    def figure(self) -> go.Figure:
        requests = list(self.requests)
        spans = request_spans(requests, self.t0)
        now = (time.perf_counter() - (self.t0 or requests[0].metrics.arrival_time)) if requests else 0.0
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.72, 0.28], vertical_spacing=0.05)
        phases = {"queued": ([], [], QUEUE_COLOR), "prefill": ([], [], PREFILL_COLOR), "decode": ([], [], DECODE_COLOR)}
        aborted_x, aborted_y = [], []
        for i, s in enumerate(spans):
            end = s.end if s.end is not None else now
            cuts = [("queued", s.arrival, s.scheduled if s.scheduled is not None else end)]
            if s.scheduled is not None:
                cuts.append(("prefill", s.scheduled, s.first_token if s.first_token is not None else end))
            if s.first_token is not None:
                cuts.append(("decode", s.first_token, end))
            for phase, a, b in cuts:
                xs, ys, _ = phases[phase]
                xs += [a, b, None]
                ys += [i, i, None]
            if s.aborted:
                aborted_x.append(end)
                aborted_y.append(i)
        width = max(1.5, min(6.0, 300 / max(1, len(spans))))
        for name, (xs, ys, color) in phases.items():
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=color, width=width), name=name,
                                     hoverinfo="skip"), row=1, col=1)
        fig.add_trace(go.Scatter(x=aborted_x, y=aborted_y, mode="markers", name="aborted",
                                 marker=dict(symbol="x", color=ABORT_COLOR, size=8)), row=1, col=1)
        times, waiting, running = occupancy(spans, now)
        fig.add_trace(go.Scatter(x=times, y=running, mode="lines", line=dict(shape="hv", color=DECODE_COLOR),
                                 name="running"), row=2, col=1)
        fig.add_trace(go.Scatter(x=times, y=waiting, mode="lines", line=dict(shape="hv", color=QUEUE_COLOR),
                                 name="waiting"), row=2, col=1)
        num_done = sum(1 for s in spans if s.end is not None)
        fig.update_layout(title=f"{self.title}: {len(spans)} arrived, {num_done} ended", height=520,
                          margin=dict(l=60, r=20, t=60, b=40), legend=dict(orientation="h", y=-0.12))
        fig.update_yaxes(title_text="request (arrival order)", autorange="reversed", row=1, col=1)
        fig.update_yaxes(title_text="requests", row=2, col=1)
        fig.update_xaxes(title_text="seconds", row=2, col=1)
        return fig

    def watch(self, fn: Callable[[], object], interval_s: float = 0.25, mode: str | None = None):
        """Run `fn()` while the view redraws live; return what `fn` returned."""
        from minilm_engine.course.viz import default_mode, static_bundle

        mode = mode or default_mode()
        box: dict = {}

        def target():
            try:
                box["value"] = fn()
            except BaseException as e:  # handed back to the caller's thread
                box["error"] = e

        self.t0 = time.perf_counter()
        worker = threading.Thread(target=target, name="serving-view-load")
        if mode == "widget":
            from IPython.display import display

            widget = go.FigureWidget(self.figure())
            display(widget)
            worker.start()
            while worker.is_alive():
                worker.join(interval_s)
                _copy(self.figure(), widget)
            _copy(self.figure(), widget)
        else:
            worker.start()
            worker.join()
            try:
                from IPython.display import display

                display(static_bundle(self.figure()), raw=True)
            except ImportError:
                pass
        if "error" in box:
            raise box["error"]
        return box.get("value")


def _copy(source: go.Figure, target: go.FigureWidget) -> None:
    with target.batch_update():
        for fresh, live in zip(source.data, target.data):
            live.x, live.y = fresh.x, fresh.y
        target.layout.title = source.layout.title
