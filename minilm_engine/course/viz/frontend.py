"""Which notebook frontend the views are drawn in, and so which live figure they use.

Contract: `in_colab()` is true inside Google Colab, detected by the `COLAB_NOTEBOOK_ID`
environment variable that Colab's runtime sets (importing `google.colab` is not a reliable test:
the package is importable outside Colab, plotly.py#5473).  `live_renderer()` names the live
figure a view builds:

    "figurewidget"  plotly's `go.FigureWidget` (ipywidgets 8): JupyterLab, VS Code, Binder
    "anywidget"     `PlotlyAnyWidget` (anywidget_figure.py): Colab, whose ipywidgets 7.7.1 cannot
                    show a pre-6 FigureWidget (plotly.py#2202) and which does not support
                    ipywidgets 8 (colabtools#4525), but does load anywidget modules

$MINILM_WIDGET_RENDERER ("figurewidget" or "anywidget") overrides the choice.
"""

from __future__ import annotations

import os

COLAB_ENV_VAR = "COLAB_NOTEBOOK_ID"
RENDERER_ENV_VAR = "MINILM_WIDGET_RENDERER"
LIVE_RENDERERS = ("figurewidget", "anywidget")


def in_colab() -> bool:
    return bool(os.environ.get(COLAB_ENV_VAR))


def live_renderer() -> str:
    chosen = os.environ.get(RENDERER_ENV_VAR, "").strip().lower()
    if chosen:
        if chosen not in LIVE_RENDERERS:
            raise ValueError(f"{RENDERER_ENV_VAR} must be one of {LIVE_RENDERERS}, got {chosen!r}")
        return chosen
    return "anywidget" if in_colab() else "figurewidget"
