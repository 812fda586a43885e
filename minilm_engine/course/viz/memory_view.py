"""Where the KV cache lives: the paged block pool, next to what a contiguous cache would reserve.

Contract: `MemoryView(engine).figure()` draws the engine's pool and running requests as they are
now; `.widget()` follows the engine live (see `live.py`).  Nothing here changes the engine.

    paged pool (16 blocks a row)                 contiguous (one row per request)
    ┌──┬──┬──┬──┬──┬──┬──┬──┐                    A ████████░░░░░░░░░░░░░░░░  reserved
    │×3│×3│A │A │B │C │··│  │ ...                B ██████░░░░░░░░░░░░░░░░░░  vs used
    └──┴──┴──┴──┴──┴──┴──┴──┘                    C ████░░░░░░░░░░░░░░░░░░░░
     ×n: shared by n requests (outlined)   ··: cached-free (pale)   blank: free (grey)

Waste is counted in token slots, for the requests that run now:
  * paged: slots of the blocks they hold (each block once, however many share it) minus the
    tokens stored in them: only the unfilled tail of each request's last block is empty;
  * contiguous: each request reserves `prompt + max_tokens` slots (or `max_model_len` with
    reserve="max_model_len") and uses as many as it has tokens in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minilm_engine.course.viz.colors import (
    CACHED_FREE_COLOR,
    FREE_COLOR,
    OUTLINE_COLOR,
    UNKNOWN_OWNER_COLOR,
    RequestColors,
    lighten,
)
from minilm_engine.course.viz.live import LiveView

Reserve = Literal["max_tokens", "max_model_len"]
RESERVE_LABELS = {"max_tokens": "prompt + max_tokens", "max_model_len": "max_model_len"}


@dataclass
class RequestMemory:
    """KV-cache slots of one running request under both layouts."""

    request_id: str
    num_tokens: int  # tokens whose keys/values are in the cache
    num_paged_slots: int  # len(block_table) * block_size, shared blocks included
    num_reserved_slots: int  # what a contiguous cache reserves for it


@dataclass
class MemoryWaste:
    """Empty token slots of the running requests under both layouts (see the module docstring)."""

    num_paged_slots: int
    num_paged_empty: int
    num_contiguous_slots: int
    num_contiguous_empty: int
    num_held_blocks: int  # distinct blocks in the running requests' block tables
    num_table_entries: int  # blocks summed over block tables: > num_held_blocks when shared

    @property
    def num_blocks_saved_by_sharing(self) -> int:
        return self.num_table_entries - self.num_held_blocks

    @property
    def paged_fraction(self) -> float:
        return self.num_paged_empty / self.num_paged_slots if self.num_paged_slots else 0.0

    @property
    def contiguous_fraction(self) -> float:
        if not self.num_contiguous_slots:
            return 0.0
        return self.num_contiguous_empty / self.num_contiguous_slots


@dataclass
class BlockCell:
    """One block of the pool as drawn: its state, its holders and how full it is."""

    block_id: int
    state: str  # "used", "cached_free" or "free" (BlockPool.block_state)
    ref_cnt: int
    block_hash: int | None
    owners: list[tuple[str, int]] = field(default_factory=list)  # (request_id, index in its table)
    num_filled: int = 0  # token slots holding keys/values (the fullest holder's view)


def reserved_slots(request, max_model_len: int, reserve: Reserve) -> int:
    """Slots a contiguous cache reserves for `request` up front."""
    if reserve == "max_model_len":
        return max_model_len
    return request.num_prompt_tokens + request.max_new_tokens


def request_memory(engine, reserve: Reserve = "max_tokens") -> list[RequestMemory]:
    """One row per request that holds blocks, in the scheduler's running order."""
    block_size = engine.block_manager.block_size
    tables = engine.block_manager.block_tables
    return [
        RequestMemory(
            request_id=r.request_id,
            num_tokens=r.num_computed_tokens,
            num_paged_slots=len(tables.get(r.request_id, ())) * block_size,
            num_reserved_slots=reserved_slots(r, engine.max_model_len, reserve),
        )
        for r in engine.scheduler.running
    ]


def block_cells(engine) -> list[BlockCell]:
    """Every block of the pool, with who holds it (from the block tables) and how full it is."""
    pool, manager = engine.block_pool, engine.block_manager
    block_size = manager.block_size
    num_tokens = {r.request_id: r.num_computed_tokens for r in engine.scheduler.running}
    cells = [
        BlockCell(b["block_id"], b["state"], b["ref_cnt"], b["block_hash"]) for b in pool.snapshot()
    ]
    for request_id, table in manager.block_tables.items():
        for index, block in enumerate(table):
            cell = cells[block.block_id]
            cell.owners.append((request_id, index))
            # A holder we cannot see the tokens of counts as full (never seen in practice).
            stored = num_tokens.get(request_id, (index + 1) * block_size) - index * block_size
            cell.num_filled = max(cell.num_filled, min(max(stored, 0), block_size))
    return cells


def memory_waste(engine, reserve: Reserve = "max_tokens") -> MemoryWaste:
    block_size = engine.block_manager.block_size
    held = [c for c in block_cells(engine) if c.owners]
    rows = request_memory(engine, reserve)
    num_contiguous_slots = sum(r.num_reserved_slots for r in rows)
    return MemoryWaste(
        num_paged_slots=len(held) * block_size,
        num_paged_empty=sum(block_size - c.num_filled for c in held),
        num_contiguous_slots=num_contiguous_slots,
        num_contiguous_empty=num_contiguous_slots - sum(r.num_tokens for r in rows),
        num_held_blocks=len(held),
        num_table_entries=sum(len(c.owners) for c in held),
    )


class MemoryView(LiveView):
    """The block pool as a grid, and the same requests under a contiguous reservation.

    Args:
        engine: the `LLMEngine` to follow (`llm.engine`).
        num_columns: blocks per grid row (default 16, or 32 for pools over 256 blocks).
        reserve: what a contiguous cache reserves per request: "max_tokens" (prompt +
            max_tokens, as this package's contiguous strategies do) or "max_model_len".
        max_blocks: draw at most this many blocks (a GPU pool can hold tens of thousands).
        colors: a `RequestColors` to share; by default one seeded from the engine's trace.
        throttle_s: the live widget redraws at most this often.
    """

    def __init__(
        self,
        engine,
        num_columns: int | None = None,
        reserve: Reserve = "max_tokens",
        max_blocks: int = 1024,
        colors: RequestColors | None = None,
        throttle_s: float = 0.1,
    ):
        super().__init__(engine, throttle_s)
        if reserve not in RESERVE_LABELS:
            raise ValueError(f"reserve must be one of {sorted(RESERVE_LABELS)}, got {reserve!r}")
        num_blocks = engine.block_pool.num_blocks
        self.num_columns = num_columns or (16 if num_blocks <= 256 else 32)
        if self.num_columns < 1 or max_blocks < 1:
            raise ValueError(
                f"num_columns and max_blocks must be >= 1, got {num_columns} and {max_blocks}"
            )
        self.reserve = reserve
        self.max_blocks = max_blocks
        self.colors = colors or RequestColors()

    def figure(self) -> go.Figure:
        engine = self.engine
        self.colors.observe(engine.trace.records)
        cells = block_cells(engine)[: self.max_blocks]
        rows = request_memory(engine, self.reserve)
        num_grid_rows = -(-len(cells) // self.num_columns)
        fig = make_subplots(
            rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.1,
            subplot_titles=(
                self._pool_title(cells),
                f"contiguous: each request<br>reserves {RESERVE_LABELS[self.reserve]}",
            ),
        )
        fig.update_annotations(font_size=12)  # the two subplot titles
        self._add_grid(fig, cells, num_grid_rows)  # traces 0-3
        self._add_contiguous(fig, rows)  # traces 4-9
        fig.update_layout(
            title=dict(text=_waste_title(memory_waste(engine, self.reserve), len(rows)), x=0.01),
            title_font_size=14,
            barmode="overlay",
            height=200 + max(26 * num_grid_rows, 28 * len(rows), 160),
            margin=dict(l=50, r=20, t=110, b=100),
            # Below the x-axis titles, so that a narrow notebook column does not overlap them.
            legend=dict(orientation="h", yanchor="top", y=-0.3, xanchor="left", x=0.0),
            plot_bgcolor="white",
            shapes=self._shared_outlines(cells),
            uirevision="memory-view",  # keep the user's zoom across live redraws
        )
        return fig

    def _add_grid(self, fig: go.Figure, cells: list[BlockCell], num_grid_rows: int) -> None:
        fig.add_trace(self._grid_trace(cells, num_grid_rows), 1, 1)
        for name, color, line in (  # legend entries only
            ("free", FREE_COLOR, None),
            ("cached (free, reusable prefix)", CACHED_FREE_COLOR, dict(color="#BBB", width=1)),
            ("×n = shared by n requests", "rgba(0,0,0,0)", dict(color=OUTLINE_COLOR, width=2)),
        ):
            marker = dict(symbol="square", size=13, color=color, line=line)
            legend_entry = go.Scatter(x=[None], y=[None], mode="markers", name=name, marker=marker)
            fig.add_trace(legend_entry, 1, 1)
        fig.update_xaxes(visible=False, range=[-0.5, self.num_columns - 0.5], row=1, col=1)
        fig.update_yaxes(
            autorange="reversed", scaleanchor="x", scaleratio=1, showgrid=False, zeroline=False,
            tickmode="array", tickvals=list(range(num_grid_rows)),
            ticktext=[str(r * self.num_columns) for r in range(num_grid_rows)],
            title_text="first block id", row=1, col=1,
        )

    def _add_contiguous(self, fig: go.Figure, rows: list[RequestMemory]) -> None:
        """Per request, overlaid: reserved slots (pale), tokens in the cache (solid), and the
        slots of its paged block table (a thin outline) for comparison."""
        ids = [r.request_id for r in rows]
        colors = [self.colors(rid) for rid in ids]
        block_size = self.engine.block_manager.block_size
        bars = (
            ("reserved (contiguous)", [r.num_reserved_slots for r in rows], 0.8,
             dict(color=[lighten(c, 0.75) for c in colors], line=dict(color=colors, width=1)),
             [f"{r.num_reserved_slots} slots reserved, {r.num_reserved_slots - r.num_tokens} empty"
              for r in rows]),
            ("tokens in the cache", [r.num_tokens for r in rows], 0.8, dict(color=colors),
             [f"{r.num_tokens} tokens in the KV cache" for r in rows]),
            ("its paged blocks", [r.num_paged_slots for r in rows], 0.3,
             dict(color="rgba(0,0,0,0)", line=dict(color=OUTLINE_COLOR, width=1.5)),
             [f"{r.num_paged_slots // block_size} blocks = {r.num_paged_slots} slots"
              for r in rows]),
        )
        for name, lengths, width, marker, hover in bars:
            fig.add_trace(go.Bar(
                y=ids, x=lengths, orientation="h", width=width, name=name, showlegend=False,
                marker=marker, hovertext=[f"request {rid}: {h}" for rid, h in zip(ids, hover)],
                hovertemplate="%{hovertext}<extra></extra>",
            ), 1, 2)
        for name, color, line in (  # legend entries only, in neutral colours
            ("reserved (contiguous)", "#E4E4E4", dict(color="#999", width=1)),
            ("tokens in the cache", "#7F7F7F", None),
            ("its paged blocks", "rgba(0,0,0,0)", dict(color=OUTLINE_COLOR, width=1.5)),
        ):
            marker = dict(color=color, line=line)
            legend_entry = go.Bar(x=[None], y=[None], orientation="h", name=name, marker=marker)
            fig.add_trace(legend_entry, 1, 2)
        fig.update_xaxes(
            title_text="token slots", rangemode="tozero", gridcolor="#EEE", row=1, col=2
        )
        fig.update_yaxes(autorange="reversed", type="category", row=1, col=2)

    # -- the grid ---------------------------------------------------------------------------

    def cell_color(self, cell: BlockCell) -> str:
        if cell.state == "free":
            return FREE_COLOR
        if cell.state == "cached_free":
            return CACHED_FREE_COLOR
        if not cell.owners:
            return UNKNOWN_OWNER_COLOR
        return self.colors(cell.owners[0][0])  # the first holder: who computed a shared prefix

    def _grid_trace(self, cells: list[BlockCell], num_grid_rows: int) -> go.Heatmap:
        """A heatmap with a discrete colour scale: z = index of the cell's colour + 0.5."""
        color_index: dict[str, int] = {}
        shape = (num_grid_rows, self.num_columns)
        z = [[None] * shape[1] for _ in range(shape[0])]
        text = [[""] * shape[1] for _ in range(shape[0])]
        hover = [[""] * shape[1] for _ in range(shape[0])]
        block_ids = [[None] * shape[1] for _ in range(shape[0])]
        for cell in cells:
            row, col = divmod(cell.block_id, self.num_columns)
            color = self.cell_color(cell)
            z[row][col] = color_index.setdefault(color, len(color_index)) + 0.5
            text[row][col] = f"×{cell.ref_cnt}" if cell.ref_cnt > 1 else ""
            hover[row][col] = self._cell_hover(cell)
            block_ids[row][col] = cell.block_id
        colors = list(color_index) or [FREE_COLOR]
        n = len(colors)
        colorscale = [[edge / n, c] for i, c in enumerate(colors) for edge in (i, i + 1)]
        return go.Heatmap(
            z=z, zmin=0, zmax=n, colorscale=colorscale, showscale=False, xgap=2, ygap=2,
            text=text, texttemplate="%{text}", textfont=dict(size=10, color="black"),
            hovertext=hover, hovertemplate="%{hovertext}<extra></extra>", hoverongaps=False,
            customdata=block_ids, name="blocks", showlegend=False,
        )

    def _cell_hover(self, cell: BlockCell) -> str:
        size = self.engine.block_manager.block_size
        state = cell.state.replace("_", "-")
        lines = [f"<b>block {cell.block_id}</b>: {state}, ref_cnt {cell.ref_cnt}"]
        if cell.owners:
            holders = ", ".join(
                f"{rid} (tokens {i * size}–{(i + 1) * size - 1})" for rid, i in cell.owners
            )
            lines.append(f"held by {holders}")
            lines.append(f"{cell.num_filled}/{size} slots filled")
        if cell.block_hash is not None:
            lines.append(f"prefix hash {cell.block_hash & 0xFFFFFFFF:08x}…")
        return "<br>".join(lines)

    def _shared_outlines(self, cells: list[BlockCell]) -> list[dict]:
        """A dark frame around every block with ref_cnt > 1 (layout shapes, in data units)."""
        shapes = []
        for cell in cells:
            if cell.ref_cnt > 1:
                row, col = divmod(cell.block_id, self.num_columns)
                shapes.append(dict(
                    type="rect", xref="x", yref="y", x0=col - 0.45, x1=col + 0.45, y0=row - 0.45,
                    y1=row + 0.45, line=dict(color=OUTLINE_COLOR, width=2),
                    fillcolor="rgba(0,0,0,0)",
                ))
        return shapes

    def _pool_title(self, cells: list[BlockCell]) -> str:
        pool = self.engine.block_pool
        states = [c["state"] for c in pool.snapshot()]
        shown = "" if len(cells) == pool.num_blocks else f" (first {len(cells)} shown)"
        return (
            f"paged pool: {states.count('used')} used · {states.count('cached_free')} cached · "
            f"{states.count('free')} free<br>of {pool.num_blocks} blocks"
            f" × {self.engine.block_manager.block_size} tokens{shown}"
        )


def _waste_title(waste: MemoryWaste, num_requests: int) -> str:
    if num_requests == 0:
        return "KV memory: no running request holds any (add requests, then Step or Run)"
    shared = waste.num_blocks_saved_by_sharing
    headline = (f"paged {waste.paged_fraction:.1%} wasted, contiguous {waste.contiguous_fraction:.1%} wasted"
                if shared == 0 else  # the saving is the news: the table entries point at fewer blocks
                f"{waste.num_table_entries} table entries on {waste.num_held_blocks} blocks: sharing saves {shared}")
    text = (
        f"KV memory of {num_requests} running request{'s' if num_requests != 1 else ''}: {headline}"
        f"<br><sub>paged: {waste.num_paged_empty} of {waste.num_paged_slots} slots empty"
        f" · contiguous: {waste.num_contiguous_empty} of {waste.num_contiguous_slots} slots empty"
    )
    if shared > 0:
        text += f" · prefix sharing saves {shared} block{'s' if shared != 1 else ''}"
    return text + "</sub>"
