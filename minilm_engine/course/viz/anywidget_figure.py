"""A live plotly figure that any anywidget frontend draws: Colab's included.

Contract: `PlotlyAnyWidget(figure)` is an `anywidget.AnyWidget` whose synced `figure` trait holds
the figure as plotly JSON; its JavaScript loads plotly.js (the version that matches the
installed plotly, from plotly's CDN) once per page and calls `Plotly.react` on every change, so
a redraw replaces the data without flicker.  `show_figure(fig)` sends a new figure.  It needs
only anywidget (0.9 or later) and works with ipywidgets 7 and 8 alike, which is why the views
use it in Colab (`frontend.live_renderer()`).
"""

from __future__ import annotations

import json

import anywidget
import plotly.graph_objects as go
import traitlets
from plotly.offline import get_plotlyjs_version

_ESM = """
const PLOTLY_URL = "https://cdn.plot.ly/plotly-%(version)s.min.js";

function loadPlotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!window.__minilmPlotly) {
    window.__minilmPlotly = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = PLOTLY_URL;
      script.onload = () => resolve(window.Plotly);
      script.onerror = () => reject(new Error("could not load " + PLOTLY_URL));
      document.head.appendChild(script);
    });
  }
  return window.__minilmPlotly;
}

async function render({ model, el }) {
  const div = document.createElement("div");
  el.appendChild(div);
  let Plotly;
  try {
    Plotly = await loadPlotly();
  } catch (error) {
    div.textContent = String(error);
    return;
  }
  const draw = () => {
    const figure = model.get("figure") || {};
    Plotly.react(div, figure.data || [], figure.layout || {}, { responsive: true });
  };
  draw();
  model.on("change:figure", draw);
  return () => { model.off("change:figure", draw); Plotly.purge(div); };
}

export default { render };
"""


class PlotlyAnyWidget(anywidget.AnyWidget):
    _esm = _ESM % {"version": get_plotlyjs_version()}
    figure = traitlets.Dict().tag(sync=True)

    def __init__(self, figure: go.Figure | None = None, **kwargs):
        super().__init__(**kwargs)
        if figure is not None:
            self.show_figure(figure)

    def show_figure(self, figure: go.Figure) -> None:
        """Send `figure` to the frontend (plotly's JSON encoder turns arrays into lists)."""
        self.figure = json.loads(figure.to_json())
