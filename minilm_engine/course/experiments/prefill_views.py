"""Chapter 04's figures and the small sums behind them: a prefill in decode steps (measured beside
the roofline of this machine and of a datasheet GPU), the steps of a chunked prefill against the
prefix each chunk attends over, and the token-budget trade-off.

Contract: pure functions of what `prefill.time_prefill`, `prefill.long_prompt_interference` and
`prefill.budget_sweep` return; nothing here runs the engine.

    modelled prefill(T) = max(weight bytes / read bandwidth,  prefill FLOPs(T) / matmul FLOP/s)
    in decode steps     = modelled prefill(T) / (weight bytes / read bandwidth)
    flat (about one decode step) up to T ~ B*, then growing as T: the same roofline as chapter 01's
    batch of B decode rows, with the prompt's T tokens as the rows
"""

from __future__ import annotations

from collections.abc import Sequence

from minilm_engine.course.experiments.prefill import prefill_flops
from minilm_engine.model.config import ModelConfig


def modelled_prefill_s(config: ModelConfig, num_tokens: int, weight_bytes: float, read_bandwidth: float,
                       matmul_flops: float) -> float:
    """The roofline's prefill: the weights read once, or the prompt's FLOPs (a causal attention
    kernel's), whichever takes longer."""
    return max(weight_bytes / read_bandwidth, prefill_flops(config, num_tokens, causal=True).total / matmul_flops)


def prefill_ridge_tokens(config: ModelConfig, weight_bytes: float, read_bandwidth: float,
                         matmul_flops: float) -> int:
    """The shortest prompt whose FLOPs take longer than one read of the weights (B* for a prefill)."""
    read_s = weight_bytes / read_bandwidth
    num_tokens = 1
    while prefill_flops(config, num_tokens, causal=True).total / matmul_flops < read_s:
        num_tokens += 1
    return num_tokens


def prefill_in_steps_figure(lengths: Sequence[int], measured, config: ModelConfig, here: dict, gpu: dict):
    """Prefill time in decode steps against prompt length, log-log: the measured ratios (median
    and interval, `claims.Measurement`s, one per length) over this machine's modelled roofline,
    and a datasheet GPU's modelled roofline beside them.

    `here` and `gpu`: dicts with name, weight_bytes, read_bandwidth, matmul_flops.
    """
    import numpy as np
    import plotly.graph_objects as go

    grid = np.unique(np.geomspace(1, max(max(lengths), 4096), 120).astype(int))
    fig = go.Figure()
    for machine, color, dash in ((here, "#636EFA", "dot"), (gpu, "#EF553B", "dash")):
        read_s = machine["weight_bytes"] / machine["read_bandwidth"]
        ys = [modelled_prefill_s(config, int(t), machine["weight_bytes"], machine["read_bandwidth"],
                                 machine["matmul_flops"]) / read_s for t in grid]
        fig.add_scatter(x=grid, y=ys, mode="lines", line=dict(color=color, dash=dash),
                        name=f"modelled: {machine['name']}")
    fig.add_scatter(
        x=list(lengths), y=[m.value for m in measured], mode="markers+lines", name="measured here (median, 95% interval)",
        marker=dict(size=8, color="black"), line=dict(color="black"),
        error_y=dict(type="data", symmetric=False, array=[m.high - m.value for m in measured],
                     arrayminus=[m.value - m.low for m in measured]),
    )
    fig.add_hline(y=1, line=dict(color="gray", width=1))
    fig.update_xaxes(type="log", title_text="prompt tokens T (log scale)")
    fig.update_yaxes(type="log", title_text="prefill time / one decode step (log scale)")
    fig.update_layout(title="A prefill costs one decode step until its FLOPs outgrow the weight read"
                            f"<br><sub>modelled: the roofline of each machine's ceilings; {gpu['name']}: {gpu['source']}</sub>",
                      height=460, legend=dict(x=0.01, y=0.99, bgcolor="rgba(255,255,255,0.85)"),
                      margin=dict(t=60, b=40, r=20))
    return fig


def chunk_steps(records, request_suffix: str = "-long"):
    """One row per step that computed a chunk of the request whose id ends with `request_suffix`:
    the step's `duration_s`, the chunk's `chunk_tokens`, `keys_attended` (the prompt tokens before
    the chunk plus the chunk: the keys its last query attends over) and the step's
    `num_decode_tokens` (the streams served beside it)."""
    import pandas as pd

    rows, done = [], {}
    for record in records:
        for chunk in record.chunks:
            if chunk.request_id.endswith(request_suffix) and chunk.num_prefill_tokens:
                before = done.get(chunk.request_id, 0)
                done[chunk.request_id] = before + chunk.num_prefill_tokens
                rows.append({"request_id": chunk.request_id, "duration_s": record.duration_s,
                             "chunk_tokens": chunk.num_prefill_tokens, "keys_attended": before + chunk.num_prefill_tokens,
                             "num_decode_tokens": record.num_decode_tokens})
    return pd.DataFrame(rows)


def chunk_steps_figure(chunks, decode_only_s: float):
    """Each full-size chunk step's wall time against the keys its chunk attends over, beside the
    median step that carries only the streams' decode tokens (the last, shorter chunk is left out:
    it is cheaper because it is smaller, not because of where it sits)."""
    import plotly.graph_objects as go

    chunks = chunks[chunks.chunk_tokens == chunks.chunk_tokens.max()]
    fig = go.Figure()
    fig.add_scatter(x=chunks.keys_attended, y=1e3 * chunks.duration_s, mode="markers",
                    marker=dict(size=7, color="#636EFA", opacity=0.6),
                    name=f"one {chunks.chunk_tokens.max()}-token chunk + the decodes")
    medians = chunks.groupby("keys_attended").duration_s.median()
    fig.add_scatter(x=medians.index, y=1e3 * medians.values, mode="lines", line=dict(color="#636EFA"),
                    name="median over the rounds")
    fig.add_scatter(x=[0, chunks.keys_attended.max()], y=[1e3 * decode_only_s] * 2, mode="lines",
                    line=dict(color="gray", dash="dash"), name="a step: the decodes only (median)")
    fig.update_xaxes(title_text="prompt tokens in the cache after the chunk (keys it attends over)", rangemode="tozero")
    fig.update_yaxes(title_text="step wall time (ms)", rangemode="tozero")
    fig.update_layout(title="Chunks of the same size cost more as the prefix behind them grows",
                      height=420, legend=dict(x=0.99, xanchor="right", y=0.02, yanchor="bottom",
                                              bgcolor="rgba(255,255,255,0.85)"), margin=dict(t=60, b=40, r=20))
    return fig


def budget_sweep_figure(sweep: Sequence[dict], p99_itl_target_s: float, num_decoding: int):
    """The token budget's trade-off: the streams' P99 ITL and the long prompt's TTFT against
    `max_num_batched_tokens`, each on its own panel, both in ms, the SLO target drawn."""
    from plotly.subplots import make_subplots

    budgets = [r["max_num_batched_tokens"] for r in sweep]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("the streams: P99 inter-token latency",
                                        f"the long prompt: time to first token (dotted: budget {num_decoding})"))
    fig.add_scatter(x=budgets, y=[1e3 * r["p99_itl_s"] for r in sweep], mode="markers+lines", name="P99 ITL",
                    marker=dict(color="#636EFA"), row=1, col=1)
    fig.add_scatter(x=budgets, y=[1e3 * r["mean_itl_s"] for r in sweep], mode="markers+lines", name="mean ITL",
                    marker=dict(color="#00CC96"), line=dict(dash="dot"), row=1, col=1)
    fig.add_scatter(x=[min(budgets), max(budgets)], y=[1e3 * p99_itl_target_s] * 2, mode="lines",
                    line=dict(color="#CF222E", dash="dash"), name="P99 ITL target (the SLO)", row=1, col=1)
    fig.add_scatter(x=budgets, y=[1e3 * r["long_ttft_s"] for r in sweep], mode="markers+lines",
                    name="long prompt TTFT", marker=dict(color="#AB63FA"), row=1, col=2)
    fig.add_vline(x=num_decoding, line=dict(color="gray", dash="dot"), row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(type="log", title_text="max_num_batched_tokens (log scale)", row=1, col=col)
        fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=col)
    fig.update_layout(height=420, legend=dict(orientation="h", y=-0.25), margin=dict(t=60, b=40, r=20))
    return fig
