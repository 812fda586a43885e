"""Speculative decoding, round by round: each request's drafts, and what the target made of them.

Contract: `SpecView(engine).figure()` draws `engine.trace.records` of an engine with a draft
model (`speculative_config`) as they are now; `.widget()` follows the engine live (`live.py`).
Nothing here changes the engine.

    request r0 │ ░░ ▮  ▮▮▮▮◆  ▮▮✗··◆  ▮▮▮▮◆        one column per engine step; in a step with
    request r1 │    ░░  ▮▮✗··◆  ▮▮▮▮◆  ▮✗···◆      drafts, K small cells and then the target's:
               └──────────────────────── step      ▮ accepted  ✗ rejected  · never read
    acceptance │ ─────╲____╱──────                 ◆ the target's token: a correction after a
                                                   rejection, or the bonus when all K passed;
░ = prefill (hatched), a lone cell = a step without drafts.  Underneath: the running
acceptance rate (accepted / drafted) and tokens per verification round, over the steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minilm_engine.course.viz.batch_view import PREFILL_PATTERN
from minilm_engine.course.viz.colors import OUTLINE_COLOR, PREFILL_LEGEND_COLOR
from minilm_engine.course.viz.live import LiveView

# name -> colour, in the order the figure's traces come (one bar trace per kind).
KIND_COLORS = {
    "prefill": PREFILL_LEGEND_COLOR,
    "decode": "#7F7F7F",  # a step without drafts: the target's one token
    "accepted": "#2CA02C",
    "rejected": "#D62728",
    "unread": "#D9D9D9",  # drafted after a rejection: discarded without being checked
    "correction": "#1F77B4",  # the target's token that replaces the first rejected draft
    "bonus": "#9467BD",  # the target's extra token when every draft was accepted
}


@dataclass
class SpecCell:
    """One small cell: a draft, or a token the target added, or a step without drafts."""

    step: int
    request_id: str
    kind: str  # a key of KIND_COLORS
    position: int  # 0.. within the step's column
    width: int  # cells in the step's column (K + 1 in a round, 1 otherwise)
    token_id: int | None


def spec_cells(records) -> list[SpecCell]:
    """Every cell of `records` (see the module docstring)."""
    cells = []
    for record in records:
        for c in record.chunks:
            if c.num_prefill_tokens:
                cells.append(SpecCell(record.step, c.request_id, "prefill", 0, 1, None))
                continue
            drafts = c.draft_token_ids
            if not drafts:
                token = c.output_token_ids[0] if c.output_token_ids else None
                cells.append(SpecCell(record.step, c.request_id, "decode", 0, 1, token))
                continue
            width = len(drafts) + 1
            num_accepted = c.num_accepted_tokens
            for j, token in enumerate(drafts):
                kind = "accepted" if j < num_accepted else "rejected" if j == num_accepted else "unread"
                cells.append(SpecCell(record.step, c.request_id, kind, j, width, token))
            own = "bonus" if num_accepted == len(drafts) else "correction"
            cells.append(SpecCell(record.step, c.request_id, own, len(drafts), width, c.output_token_ids[-1]))
    return cells


class SpecView(LiveView):
    """Drafts accepted, rejected or never read, and the target's own token, per request and step.

    Args:
        engine: an `LLMEngine` built with a `speculative_config` (`llm.engine`).
        tokenizer: shows each cell's token text on hover (default: the engine's).
        max_steps: show only the last `max_steps` steps (None = all).
        throttle_s: the live widget redraws at most this often.
    """

    def __init__(self, engine, tokenizer=None, max_steps: int | None = None, throttle_s: float = 0.1):
        if engine.proposer is None:
            raise ValueError(
                "this engine does not speculate: create the LLM with speculative_config="
                "{'model': ..., 'num_speculative_tokens': K}"
            )
        super().__init__(engine, throttle_s)
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {max_steps}")
        self.tokenizer = tokenizer or engine.tokenizer
        self.max_steps = max_steps

    def figure(self) -> go.Figure:
        records = self.engine.trace.records
        if self.max_steps is not None:
            records = records[-self.max_steps :]
        cells = spec_cells(records)
        rows = list(dict.fromkeys(c.request_id for c in cells))  # first-seen order
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.72, 0.28], vertical_spacing=0.06)
        for kind, color in KIND_COLORS.items():  # traces 0..6: one per kind of cell
            chosen = [c for c in cells if c.kind == kind]
            fig.add_trace(self._cell_trace(kind, color, chosen), 1, 1)
        steps, rate, per_round = _running_rates(records)
        fig.add_trace(  # trace 7: the running acceptance rate
            go.Scatter(x=steps, y=rate, mode="lines", name="acceptance rate (so far)",
                       line=dict(color=KIND_COLORS["accepted"], width=2),
                       hovertemplate="step %{x}: %{y:.1%} of drafts accepted so far<extra></extra>"),
            2, 1,
        )
        fig.add_trace(  # trace 8: tokens per verification round this step, on a right-hand axis
            go.Scatter(x=steps, y=per_round, mode="markers", name="tokens per round (this step)",
                       xaxis="x2", yaxis="y3", marker=dict(color=OUTLINE_COLOR, size=5),
                       hovertemplate="step %{x}: %{y:.2f} tokens per round<extra></extra>"),
        )
        fig.update_layout(
            title=dict(text=self._title(records), x=0.01, font=dict(size=14)),
            barmode="overlay", bargap=0,
            height=300 + 26 * max(len(rows), 3),
            margin=dict(l=70, r=60, t=80, b=40),
            legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
            plot_bgcolor="white",
            uirevision="spec-view",
            yaxis3=dict(overlaying="y2", side="right", rangemode="tozero", title="tokens / round", showgrid=False),
        )
        fig.update_yaxes(title_text="request", type="category", categoryorder="array", categoryarray=rows,
                         autorange="reversed", showgrid=False, row=1, col=1)
        fig.update_yaxes(title_text="accepted", range=[0, 1.05], tickformat=".0%", gridcolor="#EEE", row=2, col=1)
        fig.update_xaxes(showgrid=False, zeroline=False)
        fig.update_xaxes(title_text="engine step", row=2, col=1)
        return fig

    def _cell_trace(self, kind: str, color: str, cells: list[SpecCell]) -> go.Bar:
        return go.Bar(
            x=[0.9 / c.width for c in cells],
            base=[c.step - 0.45 + 0.9 * c.position / c.width for c in cells],
            y=[c.request_id for c in cells],
            orientation="h", width=0.7, name=kind,
            marker=dict(color=color, line=dict(width=0.5, color="white"),
                        pattern=PREFILL_PATTERN if kind == "prefill" else None),
            hovertext=[self._hover(c) for c in cells],
            hovertemplate="%{hovertext}<extra></extra>",
        )

    def _hover(self, cell: SpecCell) -> str:
        text = "" if cell.token_id is None else repr(self.tokenizer.decode([cell.token_id]))
        return f"<b>request {cell.request_id}</b> · step {cell.step}<br>{cell.kind} {text}"

    def _title(self, records) -> str:
        stats = self.engine.spec_decoding_stats
        k = stats.num_spec_tokens
        if not records or not stats.num_drafts:
            return f"Speculative decoding, K = {k}: no verification round yet (Step or Run)"
        return (
            f"Speculative decoding, K = {k}: {stats.num_accepted_tokens} of {stats.num_draft_tokens} "
            f"drafts accepted ({stats.draft_acceptance_rate:.0%})"
            f"<br><sub>{stats.num_drafts} rounds, {stats.mean_acceptance_length:.2f} tokens per round "
            f"(per target forward); alpha = {stats.alpha:.2f}</sub>"
        )


def _running_rates(records) -> tuple[list[int], list[float | None], list[float | None]]:
    """Per step: accepted / drafted so far, and this step's tokens per round (None: no round)."""
    steps, rate, per_round = [], [], []
    drafted = accepted = 0
    for record in records:
        rounds = [c for c in record.chunks if c.num_draft_tokens]
        drafted += sum(c.num_draft_tokens for c in rounds)
        accepted += sum(c.num_accepted_tokens for c in rounds)
        steps.append(record.step)
        rate.append(accepted / drafted if drafted else None)
        per_round.append(1 + sum(c.num_accepted_tokens for c in rounds) / len(rounds) if rounds else None)
    return steps, rate, per_round
