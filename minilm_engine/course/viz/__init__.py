"""Pictures of the continuous engine, static or live: who runs in each step, and where the KV lives.

    from minilm_engine.course import viz
    engine = llm.engine                     # an LLM's engine
    viz.show(viz.BatchView(engine))         # batch slots x engine steps
    viz.show(viz.MemoryView(engine))        # the block pool, and the contiguous alternative
    viz.show(viz.SpecView(engine))          # speculative decoding: drafts accepted / rejected
    viz.LedgerDashboard(results).show()     # a measured technique ladder in three modes (ch. 08)

Contract: every view has `.figure()` (a `plotly.graph_objects.Figure` of the engine as it is now;
needs no widget frontend, so it survives headless execution and HTML export) and `.widget()`
(an ipywidgets box with a live `FigureWidget` and Step / Run / delay controls).  `show` picks one:
the static figure when `MINILM_STATIC_FIGURES=1` or no Jupyter kernel runs, the widget otherwise.
Under MINILM_STATIC_FIGURES=1 static figures are PNG images (what GitHub renders); in Colab
(detected by $COLAB_NOTEBOOK_ID, see `frontend.py`) the live figure is an anywidget view, since
Colab's ipywidgets 7 cannot show plotly's FigureWidget.
"""

from __future__ import annotations

import os
from typing import Literal

from minilm_engine.course.viz.batch_view import BatchCell, BatchView, batch_cells
from minilm_engine.course.viz.colors import PALETTE, RequestColors
from minilm_engine.course.viz.dashboard import LedgerDashboard
from minilm_engine.course.viz.frontend import in_colab, live_renderer
from minilm_engine.course.viz.live import EngineControls, LiveView, live_figure, update_live_figure
from minilm_engine.course.viz.memory_view import (
    BlockCell,
    MemoryView,
    MemoryWaste,
    RequestMemory,
    block_cells,
    memory_waste,
    request_memory,
)
from minilm_engine.course.viz.spec_view import SpecCell, SpecView, spec_cells

ShowMode = Literal["widget", "static"]
STATIC_ENV_VAR = "MINILM_STATIC_FIGURES"


def default_mode() -> ShowMode:
    """Return "static" if MINILM_STATIC_FIGURES=1 or no IPython kernel runs, else "widget"."""
    if os.environ.get(STATIC_ENV_VAR, "").strip() == "1":
        return "static"
    try:
        from IPython import get_ipython
    except ImportError:
        return "static"
    shell = get_ipython()
    has_kernel = shell is not None and getattr(shell, "kernel", None) is not None
    return "widget" if has_kernel else "static"


def show(
    view: LiveView, mode: ShowMode | None = None, *, include_plotlyjs: str | bool = "cdn"
) -> None:
    """Display `view` as a live widget or a static figure (mode None = `default_mode()`).

    The static figure goes out as two representations: plotly's own mimetype, which JupyterLab
    draws interactively, and self-contained HTML, which the HTML export of an executed notebook
    shows.  `include_plotlyjs` is passed to `Figure.to_html`: "cdn" loads plotly.js from the web
    when the page is viewed; True embeds it (about 4.5 MB per figure) for fully offline pages.
    """
    mode = mode or default_mode()
    if mode not in ("widget", "static"):
        raise ValueError(f"mode must be 'widget', 'static' or None, got {mode!r}")
    try:
        from IPython.display import display
    except ImportError as missing:  # plain Python without IPython: only the figure can be shown
        if mode == "widget":
            raise RuntimeError("widgets need Jupyter (IPython is not installed); use mode='static'") from missing
        view.figure().show()  # plotly opens a browser tab
        return
    if mode == "widget":
        display(view.widget())
    else:
        display(static_bundle(view.figure(), include_plotlyjs), raw=True)


def static_bundle(figure, include_plotlyjs: str | bool = "cdn") -> dict[str, object]:
    """A display bundle for a figure that needs no widget frontend (see `show`).

    Under MINILM_STATIC_FIGURES=1 (CI, and the runs whose outputs are committed) it is a PNG
    drawn by matplotlib (`static_png.py`): GitHub shows images, not plotly's JavaScript.
    """
    import plotly.io as pio

    if os.environ.get(STATIC_ENV_VAR, "").strip() == "1":
        from minilm_engine.course.viz.static_png import png_bundle

        return png_bundle(figure)

    bundle = dict(pio.renderers["plotly_mimetype"].to_mimebundle(figure.to_dict()))
    bundle["text/html"] = figure.to_html(full_html=False, include_plotlyjs=include_plotlyjs)
    title = figure.layout.title.text or "figure"
    bundle["text/plain"] = f"<plotly figure: {title.split('<br>')[0]}>"
    return bundle


__all__ = [
    "PALETTE",
    "BatchCell",
    "BatchView",
    "BlockCell",
    "EngineControls",
    "LedgerDashboard",
    "LiveView",
    "MemoryView",
    "MemoryWaste",
    "RequestColors",
    "RequestMemory",
    "SpecCell",
    "SpecView",
    "batch_cells",
    "block_cells",
    "default_mode",
    "in_colab",
    "live_figure",
    "live_renderer",
    "memory_waste",
    "request_memory",
    "spec_cells",
    "show",
    "static_bundle",
    "update_live_figure",
]
