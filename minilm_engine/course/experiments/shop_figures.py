"""Chapter 00's figures: the ledger's one division drawn, and this machine's serving measured.

Contract: `ledger_figure` draws cost per unit against units sold for one monthly cost;
`serving_figure` draws, per way of serving, what the machine produces and what one user sees
(tokens/s, from `cost.Throughput`s); `cost_curve_figure` draws cost per million tokens against
tokens/s for several hourly prices (log-log), with named points (a measured setup, a modelled
GPU) placed on their price's line.  Pure drawing: every number comes from the caller.
"""

from __future__ import annotations

from minilm_engine.course.experiments.cost import Throughput, cost_per_million_tokens, unit_cost

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def ledger_figure(monthly_cost: float, units: list[float], marks: list[float], currency: str = "yuan",
                  unit: str = "bowl"):
    """Cost per unit = monthly cost / units sold, with the `marks` as points."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_scatter(x=units, y=[unit_cost(monthly_cost, n) for n in units], mode="lines",
                    name=f"{monthly_cost:,.0f} {currency} a month / {unit}s sold", line=dict(color=COLORS[0]))
    fig.add_scatter(x=marks, y=[unit_cost(monthly_cost, n) for n in marks], mode="markers",
                    marker=dict(size=9, color=COLORS[1]), name="the three months of the table")
    fig.update_xaxes(title_text=f"{unit}s sold in a month", rangemode="tozero")
    fig.update_yaxes(title_text=f"cost of one {unit} ({currency})", rangemode="tozero")
    fig.update_layout(title=f"The ledger: the same month's cost spread over more {unit}s", height=380)
    return fig


def serving_figure(results: dict[str, Throughput], title: str = ""):
    """Left: tokens/s the machine produces, per way of serving.  Right: tokens/s one user sees
    (one over the time per output token) for the same setups."""
    from plotly.subplots import make_subplots

    names = list(results)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=("the machine: all users together", "one user: their own stream"))
    fig.add_bar(x=names, y=[results[n].output_tokens_per_s for n in names], marker_color=COLORS[0],
                showlegend=False, row=1, col=1)
    fig.add_bar(x=names, y=[results[n].tokens_per_s_per_request or 0 for n in names], marker_color=COLORS[2],
                showlegend=False, row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(title_text="how the requests were served", row=1, col=col)
        fig.update_yaxes(title_text="generated tokens/s", rangemode="tozero", row=1, col=col)
    fig.update_layout(title=title, height=420, margin=dict(l=80, t=90))
    return fig


def cost_curve_figure(prices: dict[str, float], tokens_per_s: tuple[float, float],
                      points: list[tuple[str, float, float]], title: str = ""):
    """Cost per million tokens against tokens/s, one line per hourly price (log-log axes with
    labelled ticks); `points` are (label, price per hour, tokens/s), drawn on their price's line."""
    import plotly.graph_objects as go

    low, high = tokens_per_s
    xs = [low * (high / low) ** (k / 40) for k in range(41)]
    fig = go.Figure()
    for i, (label, price) in enumerate(prices.items()):
        fig.add_scatter(x=xs, y=[cost_per_million_tokens(price, x) for x in xs], mode="lines",
                        line=dict(color=COLORS[i % len(COLORS)], dash="dash"), name=f"rented at {label}")
    for j, (label, price, speed) in enumerate(points):
        fig.add_scatter(x=[speed], y=[cost_per_million_tokens(price, speed)], mode="markers",
                        marker=dict(size=10, symbol=("circle", "square", "diamond", "triangle-up")[j % 4]),
                        name=label)
    costs = [cost_per_million_tokens(p, x) for p in prices.values() for x in (low, high)]
    decades = [10.0**e for e in range(-4, 7)]
    fig.update_xaxes(type="log", title_text="tokens/s the machine produces",
                     tickvals=[d * m for d in decades for m in (1, 3) if low / 1.5 <= d * m <= high * 1.5])
    fig.update_yaxes(type="log", title_text="cost of one million tokens ($)",
                     tickvals=[d * m for d in decades for m in (1, 3) if min(costs) / 1.5 <= d * m <= max(costs) * 1.5])
    fig.update_layout(title=title, height=460, margin=dict(l=80, t=110))
    return fig
