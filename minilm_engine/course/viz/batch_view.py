"""Who ran in which engine step: batch slots (y) by engine steps (x), one cell per scheduled chunk.

Contract: `BatchView(engine).figure()` draws `engine.trace.records` as they are now; `.widget()`
follows the engine live (see `live.py`).  Nothing here changes the engine.

    slot 0 │ A A A A A A A ✕           A A A        one colour per request, stable across steps;
    slot 1 │ B B B B B D D D D D D D                hatched = prefill (prompt, prompt chunk or
    slot 2 │   C C C C C C C C C                    recompute), solid = decode (one token);
           └──────────────────────── step           ✕ = preempted there
    tokens │ ▆ ▃ ▂ ▂ ▂ ▅ ▂ ...                      prefill + decode tokens of each step
    ms     │ ─╮_______╭─ ...                        wall time of each step

A "slot" is only a drawing device, not something the engine has: a request takes the lowest
free row when it is first scheduled and keeps it until it finishes, is preempted or is aborted,
so each request reads as one horizontal run and a freed row is visibly refilled next step,
the point of continuous batching.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minilm_engine.core.trace import StepRecord
from minilm_engine.course.viz.colors import (
    DECODE_LEGEND_COLOR,
    OUTLINE_COLOR,
    PREFILL_LEGEND_COLOR,
    RequestColors,
)
from minilm_engine.course.viz.live import LiveView

# Prefill cells: white diagonal stripes over the request's colour.
PREFILL_PATTERN = dict(
    shape="/", fgcolor="white", fgopacity=0.8, size=6, solidity=0.35, fillmode="overlay"
)


@dataclass
class BatchCell:
    """One scheduled chunk of one request in one step, placed in a batch slot."""

    step: int
    slot: int
    request_id: str
    num_prefill_tokens: int
    num_decode_tokens: int
    num_cached_tokens: int
    duration_s: float
    num_batch_seqs: int  # requests scheduled in this step
    num_batch_tokens: int  # tokens computed in this step, all requests together
    starts_run: bool  # the request's first cell in this slot (its label goes here)

    @property
    def is_prefill(self) -> bool:
        return self.num_prefill_tokens > 0


@dataclass
class Preemption:
    step: int
    slot: int
    request_id: str


def batch_cells(records: Sequence[StepRecord]) -> tuple[list[BatchCell], list[Preemption]]:
    """Place every scheduled chunk of `records` in a batch slot (see the module docstring)."""
    cells: list[BatchCell] = []
    preemptions: list[Preemption] = []
    slot_of: dict[str, int] = {}  # requests that hold a slot now
    for record in records:
        num_batch_tokens = record.num_prefill_tokens + record.num_decode_tokens
        for chunk in record.chunks:
            starts_run = chunk.request_id not in slot_of
            if starts_run:
                taken = set(slot_of.values())
                slot_of[chunk.request_id] = next(s for s in range(len(taken) + 1) if s not in taken)
            cells.append(
                BatchCell(
                    step=record.step,
                    slot=slot_of[chunk.request_id],
                    request_id=chunk.request_id,
                    num_prefill_tokens=chunk.num_prefill_tokens,
                    num_decode_tokens=chunk.num_decode_tokens,
                    num_cached_tokens=chunk.num_cached_tokens,
                    duration_s=record.duration_s,
                    num_batch_seqs=len(record.chunks),
                    num_batch_tokens=num_batch_tokens,
                    starts_run=starts_run,
                )
            )
        for request_id in record.preempted:
            if request_id in slot_of:
                preemptions.append(Preemption(record.step, slot_of[request_id], request_id))
        # Release the slots of requests that no longer run (finished, preempted or aborted).
        if record.block_tables or record.num_running == 0:
            slot_of = {rid: s for rid, s in slot_of.items() if rid in record.block_tables}
        else:  # a record without block tables: trust its finished/preempted lists
            gone = set(record.finished) | set(record.preempted)
            slot_of = {rid: s for rid, s in slot_of.items() if rid not in gone}
    return cells, preemptions


def _hover(cell: BatchCell) -> str:
    if cell.is_prefill:
        what = f"prefill chunk: {cell.num_prefill_tokens} tokens"
        if cell.num_cached_tokens:
            what += f" (+{cell.num_cached_tokens} from the prefix cache)"
    else:
        what = f"decode: {cell.num_decode_tokens} token"
    return (
        f"<b>request {cell.request_id}</b><br>{what}<br>step {cell.step} · slot {cell.slot}"
        f"<br>step time {cell.duration_s * 1e3:.1f} ms · batch: {cell.num_batch_seqs} requests, "
        f"{cell.num_batch_tokens} tokens"
    )


class BatchView(LiveView):
    """Batch slots by engine steps, with tokens and wall time per step underneath.

    Args:
        engine: the `LLMEngine` to follow (`llm.engine`).
        max_steps: show only the last `max_steps` steps (None = all); handy for long live runs.
        colors: a `RequestColors` to share; by default one seeded from the engine's trace.
        throttle_s: the live widget redraws at most this often.
    """

    def __init__(
        self,
        engine,
        max_steps: int | None = None,
        colors: RequestColors | None = None,
        throttle_s: float = 0.1,
    ):
        super().__init__(engine, throttle_s)
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {max_steps}")
        self.max_steps = max_steps
        self.colors = colors or RequestColors()

    def cells(self) -> tuple[list[BatchCell], list[Preemption], list[StepRecord]]:
        """The cells, preemptions and step records the figure shows (after `max_steps`)."""
        records = self.engine.trace.records
        self.colors.observe(records)
        cells, preemptions = batch_cells(records)
        if self.max_steps is not None:
            records = records[-self.max_steps :]
            first_step = records[0].step if records else 0
            cells = [c for c in cells if c.step >= first_step]
            preemptions = [p for p in preemptions if p.step >= first_step]
        return cells, preemptions, list(records)

    def figure(self) -> go.Figure:
        cells, preemptions, records = self.cells()
        num_slots = max((c.slot for c in cells), default=-1) + 1
        fig = make_subplots(
            rows=3, cols=1, shared_xaxes=True, row_heights=[0.62, 0.2, 0.18], vertical_spacing=0.04
        )
        for is_prefill in (True, False):  # traces 0 and 1: the cells
            kind = [c for c in cells if c.is_prefill == is_prefill]
            fig.add_trace(self._cell_trace(kind, is_prefill), 1, 1)
        for name, color, pattern in (  # traces 2 and 3: legend entries only
            ("prefill chunk", PREFILL_LEGEND_COLOR, PREFILL_PATTERN),
            ("decode", DECODE_LEGEND_COLOR, None),
        ):
            fig.add_trace(
                go.Bar(x=[None], y=[None], orientation="h", name=name, legendgroup=name,
                       marker=dict(color=color, pattern=pattern)),
                1, 1,
            )
        fig.add_trace(  # trace 4: preemptions
            go.Scatter(
                x=[p.step for p in preemptions], y=[p.slot for p in preemptions], mode="markers",
                name="preempted",
                marker=dict(symbol="x-thin", size=12, line=dict(width=3, color=OUTLINE_COLOR)),
                hovertext=[f"request {p.request_id} preempted at step {p.step}"
                           for p in preemptions],
                hovertemplate="%{hovertext}<extra></extra>",
            ),
            1, 1,
        )
        steps = [r.step for r in records]
        prefill = [r.num_prefill_tokens for r in records]
        fig.add_trace(  # traces 5 and 6: tokens per step, decode stacked on prefill
            go.Bar(x=steps, y=prefill, name="prefill chunk", legendgroup="prefill chunk",
                   showlegend=False, width=0.85,
                   marker=dict(color=PREFILL_LEGEND_COLOR, pattern=PREFILL_PATTERN),
                   hovertemplate="step %{x}: %{y} prefill tokens<extra></extra>"),
            2, 1,
        )
        fig.add_trace(
            go.Bar(x=steps, y=[r.num_decode_tokens for r in records], base=prefill, name="decode",
                   legendgroup="decode", showlegend=False, width=0.85,
                   marker=dict(color=DECODE_LEGEND_COLOR),
                   hovertemplate="step %{x}: %{y} decode tokens<extra></extra>"),
            2, 1,
        )
        fig.add_trace(  # trace 7: wall time per step
            go.Scatter(x=steps, y=[r.duration_s * 1e3 for r in records], mode="lines+markers",
                       name="step time", showlegend=False, line=dict(color=OUTLINE_COLOR, width=1),
                       marker=dict(size=4), hovertemplate="step %{x}: %{y:.1f} ms<extra></extra>"),
            3, 1,
        )
        fig.update_layout(
            title=dict(text=self._title(cells, records), x=0.01, font=dict(size=14)),
            barmode="overlay",
            bargap=0,
            height=330 + 22 * max(num_slots, 3),
            margin=dict(l=60, r=20, t=70, b=40),
            legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
            uniformtext=dict(minsize=8, mode="hide"),
            plot_bgcolor="white",
            uirevision="batch-view",  # keep the user's zoom across live redraws
        )
        fig.update_yaxes(title_text="batch slot", autorange="reversed", dtick=1, showgrid=False,
                         zeroline=False, row=1, col=1)
        fig.update_yaxes(title_text="tokens", rangemode="tozero", gridcolor="#EEE", row=2, col=1)
        fig.update_yaxes(title_text="ms", rangemode="tozero", gridcolor="#EEE", row=3, col=1)
        fig.update_xaxes(showgrid=False, zeroline=False)
        fig.update_xaxes(title_text="engine step", row=3, col=1)
        return fig

    def _cell_trace(self, cells: list[BatchCell], is_prefill: bool) -> go.Bar:
        return go.Bar(
            x=[1] * len(cells),  # each cell is one step wide ...
            base=[c.step - 0.5 for c in cells],  # ... centred on its step
            y=[c.slot for c in cells],
            orientation="h",
            width=0.8,
            name="prefill chunk" if is_prefill else "decode",
            legendgroup="prefill chunk" if is_prefill else "decode",
            showlegend=False,
            marker=dict(
                color=[self.colors(c.request_id) for c in cells],
                line=dict(width=0.5, color="white"),  # a hairline between steps
                pattern=PREFILL_PATTERN if is_prefill else None,
            ),
            text=[c.request_id if c.starts_run else "" for c in cells],
            textposition="inside",
            insidetextanchor="start",
            textfont=dict(color="white"),
            hovertext=[_hover(c) for c in cells],
            hovertemplate="%{hovertext}<extra></extra>",
        )

    def _title(self, cells: list[BatchCell], records: list[StepRecord]) -> str:
        if not records:
            return "Continuous batching: no step yet (add requests, then Step or Run)"
        num_requests = len({c.request_id for c in cells})
        mean_seqs = sum(len(r.chunks) for r in records) / len(records)
        num_tokens = sum(r.num_prefill_tokens + r.num_decode_tokens for r in records)
        mean_tokens = num_tokens / len(records)
        mean_ms = 1e3 * sum(r.duration_s for r in records) / len(records)
        return (
            f"Continuous batching: {len(records)} steps, {num_requests} requests"
            f"<br><sub>per step: {mean_seqs:.1f} requests, {mean_tokens:.1f} tokens,"
            f" {mean_ms:.1f} ms on average"
            f" (steps {records[0].step}–{records[-1].step})</sub>"
        )
