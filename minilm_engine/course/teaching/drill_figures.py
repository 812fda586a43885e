"""Chapter 09's figures: the worked derivations of its topics, drawn (plotly; PNG when static).

    step_time_figure   chapter 01's decode step model: step time against batch, at several contexts
    p99_figure         the chance that the maximum of n samples lies above the P99
    queueing_figure    M/M/c mean wait against utilisation, for several numbers of servers
    draft_k_figure     speculative decoding's predicted speed-up against K, for several alphas
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minilm_engine.course.teaching import drill_math as dm
from minilm_engine.course.teaching.drills import FORMULAS


def step_time_figure(model: str, gpu: str, batches, contexts) -> go.Figure:
    fig = go.Figure()
    for context in contexts:
        fig.add_trace(go.Scatter(x=list(batches), y=[FORMULAS["step_time_ms"](model, gpu, b, context) for b in batches],
                                 mode="lines+markers", name=f"context {context:,} tokens"))
    fig.update_layout(title=f"Modelled decode step of {model} on one {gpu} (datasheet rates)",
                      xaxis_title="requests in the batch (log)", yaxis_title="ms per step (log)",
                      xaxis_type="log", yaxis_type="log", height=420)
    return fig


def p99_figure(max_samples: int = 3000) -> go.Figure:
    n = np.unique(np.logspace(0, np.log10(max_samples), 60).astype(int))
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=n, y=[dm.max_exceeds_pct(99, int(k)) for k in n], mode="lines",
                             name="P(maximum of n > true P99), %"), secondary_y=False)
    fig.add_trace(go.Scatter(x=n, y=0.01 * n, mode="lines", line=dict(dash="dot"),
                             name="samples expected above the P99"), secondary_y=True)
    fig.update_xaxes(title_text="samples n (log)", type="log")
    fig.update_yaxes(title_text="probability (%)", range=[0, 105], secondary_y=False)
    fig.update_yaxes(title_text="samples above the P99 (log)", type="log", secondary_y=True)
    fig.update_layout(title="How many samples a P99 needs", height=400)
    return fig


def queueing_figure(servers=(1, 8, 64), service_s: float = 1.0) -> go.Figure:
    fig = go.Figure()
    rho = np.linspace(0.05, 0.97, 60)
    for c in servers:
        waits = [dm.mmc_wait_s(r * c / service_s, service_s, c) / service_s for r in rho]
        fig.add_trace(go.Scatter(x=100 * rho, y=waits, mode="lines", name=f"c = {c} servers"))
    fig.update_layout(title="M/M/c: mean queueing wait against utilisation", xaxis_title="utilisation (%)",
                      yaxis_title="mean wait / mean service time (log)", yaxis_type="log", height=420)
    return fig


def draft_k_figure(alphas=(0.6, 0.8, 0.9), draft_cost: float = 0.05, max_k: int = 16) -> go.Figure:
    fig = go.Figure()
    ks = list(range(1, max_k + 1))
    for alpha in alphas:
        speedups = [FORMULAS["spec_speedup"](alpha, k, draft_cost) for k in ks]
        best = FORMULAS["spec_best_k"](alpha, draft_cost)
        fig.add_trace(go.Scatter(x=ks, y=speedups, mode="lines+markers", name=f"alpha = {alpha} (best K = {best})"))
    fig.update_layout(title=f"Predicted speed-up against K (draft step = {draft_cost} of a target step, verification = 1 step)",
                      xaxis_title="drafted tokens per round K", yaxis_title="speed-up over plain decoding (x)", height=420)
    return fig
