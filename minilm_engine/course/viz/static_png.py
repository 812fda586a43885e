"""A plotly figure drawn again with matplotlib, as a PNG: the picture GitHub shows.

Contract: `figure_to_png(fig) -> bytes` draws the parts of a `plotly.graph_objects.Figure` that
the chapters use (Scatter lines/markers, Bar vertical or horizontal with `base`, Heatmap;
subplots placed by their axis domains; titles, axis titles, log axes, reversed axes, subplot
titles and other paper annotations, horizontal/vertical line shapes, a legend) on a matplotlib
canvas of the same size.  It is a faithful sketch, not a pixel copy: hover text, patterns and
in-bar labels are left out.  `png_bundle(fig)` is the display bundle (`image/png` and
`text/plain`) that `viz.show` and the "minilm_png" plotly renderer emit under
MINILM_STATIC_FIGURES=1; `use_png_renderer()` makes that renderer plotly's default, so that
`fig.show()` in a chapter also leaves a PNG.

Why not kaleido: plotly's own exporter needs a Chrome binary, which neither CI nor a fresh
laptop has; matplotlib is already a dependency and renders offline.
"""

from __future__ import annotations

import base64
import io
import math
import re
from typing import Any

DPI = 100
PLOTLY_COLORWAY = (
    "#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A",
    "#19d3f3", "#FF6692", "#B6E880", "#FF97FF", "#FECB52",
)
DASHES = {"dash": "--", "dot": ":", "dashdot": "-.", "longdash": "--", "longdashdot": "-.", "solid": "-"}
MARKERS = {"circle": "o", "square": "s", "diamond": "D", "x": "x", "x-thin": "x", "cross": "+",
           "triangle-up": "^", "triangle-down": "v", "star": "*", "line-ns": "|"}


def figure_to_png(fig) -> bytes:
    """PNG bytes of `fig` (a plotly Figure or its dict)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    spec = fig if isinstance(fig, dict) else fig.to_plotly_json()
    layout = spec.get("layout", {})
    width, height = layout.get("width") or 900, layout.get("height") or 450
    canvas = plt.figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    try:
        axes = _make_axes(canvas, spec, layout, width, height)
        for index, trace in enumerate(spec.get("data", [])):
            ax = axes[(trace.get("xaxis") or "x", trace.get("yaxis") or "y")]
            _draw_trace(ax, trace, layout, PLOTLY_COLORWAY[index % len(PLOTLY_COLORWAY)])
        _finish_axes(axes, layout)
        _annotate(canvas, layout)
        _legend(canvas, axes, layout, spec)
        buffer = io.BytesIO()
        canvas.savefig(buffer, format="png", dpi=DPI)
        return buffer.getvalue()
    finally:
        plt.close(canvas)


def png_bundle(fig) -> dict[str, Any]:
    """A display bundle with the PNG (base64, as Jupyter stores images) and a text line."""
    spec = fig if isinstance(fig, dict) else fig.to_plotly_json()
    title = _text(((spec.get("layout") or {}).get("title") or {}).get("text") or "figure")
    return {
        "image/png": base64.b64encode(figure_to_png(spec)).decode("ascii"),
        "text/plain": f"<figure: {title.splitlines()[0] if title else 'figure'}>",
    }


# -- axes ----------------------------------------------------------------------------------------


def _axis_name(ref: str, kind: str) -> str:
    """"x2" -> "xaxis2", "x" -> "xaxis"."""
    return kind + "axis" + ref[1:]


def _legend_labels(spec: dict, layout: dict) -> list[str]:
    if layout.get("showlegend") is False:
        return []
    labels = []
    for trace in spec.get("data", []):
        name = trace.get("name")
        if name and trace.get("showlegend", True) is not False and name not in labels:
            labels.append(name)
    return labels if len(labels) > 1 or layout.get("showlegend") else []


LEGEND_COLUMNS = 3
LEGEND_ROW_PX = 22


def _make_axes(canvas, spec, layout, width, height) -> dict[tuple[str, str], Any]:
    margin = layout.get("margin") or {}
    num_rows = math.ceil(len(_legend_labels(spec, layout)) / LEGEND_COLUMNS)
    left, right = (margin.get("l") or 70) / width, 1 - (margin.get("r") or 30) / width
    subplot_titles = any(n.get("yref", "paper") == "paper" and (n.get("y") or 0) >= 1
                         for n in layout.get("annotations") or [])
    top_px = max(margin.get("t") or 80, 60) + LEGEND_ROW_PX * num_rows + 16 * subplot_titles
    bottom, top = (margin.get("b") or 60) / height, 1 - top_px / height
    pairs = {(t.get("xaxis") or "x", t.get("yaxis") or "y") for t in spec.get("data", [])}
    pairs |= {("x", "y")} if not pairs else set()
    axes, shared_x = {}, {}
    # An axis that overlays another (a right-hand y axis) is a twin of the axes it overlays.
    overlays = [p for p in pairs if (layout.get(_axis_name(p[1], "y")) or {}).get("overlaying")]
    for xref, yref in sorted(set(pairs) - set(overlays), key=lambda p: (p[1], p[0])):
        xd = (layout.get(_axis_name(xref, "x")) or {}).get("domain") or [0, 1]
        yd = (layout.get(_axis_name(yref, "y")) or {}).get("domain") or [0, 1]
        rect = [left + xd[0] * (right - left), bottom + yd[0] * (top - bottom),
                (xd[1] - xd[0]) * (right - left), (yd[1] - yd[0]) * (top - bottom)]
        matches = (layout.get(_axis_name(xref, "x")) or {}).get("matches")
        share = shared_x.get(matches) if matches else None
        ax = canvas.add_axes(rect, sharex=share)
        shared_x.setdefault(xref, ax)
        ax._plotly_refs = (xref, yref)  # noqa: SLF001 - read back in _finish_axes
        axes[(xref, yref)] = ax
    for xref, yref in overlays:
        under = (layout.get(_axis_name(yref, "y")) or {})["overlaying"]
        host = axes.get((xref, under)) or next(iter(axes.values()))
        twin = host.twinx()
        twin._plotly_refs = (xref, yref)  # noqa: SLF001
        axes[(xref, yref)] = twin
    return axes


def _finish_axes(axes, layout) -> None:
    for (xref, yref), ax in axes.items():
        for kind, ref in (("x", xref), ("y", yref)):
            axis = layout.get(_axis_name(ref, kind)) or {}
            set_label = ax.set_xlabel if kind == "x" else ax.set_ylabel
            set_scale = ax.set_xscale if kind == "x" else ax.set_yscale
            set_lim = ax.set_xlim if kind == "x" else ax.set_ylim
            title = _text((axis.get("title") or {}).get("text") or "")
            if title:
                set_label(title, fontsize=9)
            if axis.get("type") == "log":
                set_scale("log")
                if axis.get("range"):
                    set_lim(*(10 ** v for v in axis["range"]))
            elif axis.get("range") and None not in axis["range"]:
                set_lim(*axis["range"])
            if axis.get("autorange") == "reversed":
                (ax.invert_xaxis if kind == "x" else ax.invert_yaxis)()
            if axis.get("rangemode") == "tozero" and axis.get("type") != "log":
                low, high = (ax.get_xlim if kind == "x" else ax.get_ylim)()
                if low > 0:
                    set_lim(0, high)
            tickvals = _values(axis.get("tickvals"))
            if tickvals:
                ticktext = _values(axis.get("ticktext"))
                if not ticktext or len(ticktext) != len(tickvals):  # plotly shows the values themselves
                    ticktext = [f"{v:g}" if isinstance(v, (int, float)) else str(v) for v in tickvals]
                (ax.set_xticks if kind == "x" else ax.set_yticks)(tickvals, [_text(str(t)) for t in ticktext])
                if axis.get("type") == "log":  # the given ticks only: no 3x10^0 between them
                    from matplotlib.ticker import NullFormatter

                    (ax.xaxis if kind == "x" else ax.yaxis).set_minor_formatter(NullFormatter())
            elif axis.get("type") == "log":  # plotly labels 1, 2, 5, 10 ..., not powers of ten
                from matplotlib.ticker import FuncFormatter, LogLocator

                target = ax.xaxis if kind == "x" else ax.yaxis
                target.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                target.set_minor_formatter(FuncFormatter(lambda v, _: ""))
            if axis.get("showticklabels") is False:
                (ax.set_xticklabels if kind == "x" else ax.set_yticklabels)([])
        ax.tick_params(labelsize=8)
        ax.grid(True, color="#E5E5E5", linewidth=0.6)
        ax.set_axisbelow(True)
        twin = (layout.get(_axis_name(yref, "y")) or {}).get("overlaying")
        for side in ("top", "left") if twin else ("top", "right"):
            ax.spines[side].set_visible(False)
        if twin:
            ax.grid(False)
    # Shared x axes (make_subplots(shared_xaxes=True)): labels on the bottom plot only.
    for (xref, _), ax in axes.items():
        axis = layout.get(_axis_name(xref, "x")) or {}
        if axis.get("matches") and not axis.get("title"):
            ax.tick_params(labelbottom=False)


# -- traces --------------------------------------------------------------------------------------


def _draw_trace(ax, trace: dict, layout: dict, default_color: str) -> None:
    kind = trace.get("type", "scatter")
    label = trace.get("name") if trace.get("showlegend", True) is not False else None
    if kind in ("scatter", "scattergl"):
        _draw_scatter(ax, trace, default_color, label)
    elif kind == "bar":
        _draw_bar(ax, trace, layout, default_color, label)
    elif kind == "heatmap":
        _draw_heatmap(ax, trace)


def _draw_scatter(ax, trace, default_color, label) -> None:
    x, y = _values(trace.get("x")), _values(trace.get("y"))
    if y is None:
        return
    if x is None:
        x = list(range(len(y)))
    points = [(a, b) for a, b in zip(x, y) if a is not None and b is not None]
    if not points:
        return
    xs, ys = zip(*points)
    mode = trace.get("mode") or ("lines+markers" if len(xs) < 20 else "lines")
    line, marker = trace.get("line") or {}, trace.get("marker") or {}
    color = _color(line.get("color") or (marker.get("color") if isinstance(marker.get("color"), str) else None)) or default_color
    kwargs = {"color": color, "label": label}
    if "lines" in mode:
        kwargs.update(linestyle=DASHES.get(line.get("dash") or "solid", "-"), linewidth=line.get("width") or 2)
    else:
        kwargs.update(linestyle="none")
    if "markers" in mode:
        kwargs.update(marker=MARKERS.get(str(marker.get("symbol") or "circle"), "o"),
                      markersize=max(2, (marker.get("size") if isinstance(marker.get("size"), (int, float)) else 6) * 0.8))
    if "lines" not in mode and "markers" not in mode:
        kwargs.update(linestyle="none", marker="o", markersize=1)
    ax.plot(xs, ys, **kwargs)
    if trace.get("fill") in ("tozeroy", "tonexty"):
        ax.fill_between(xs, ys, alpha=0.2, color=color)


def _draw_bar(ax, trace, layout, default_color, label) -> None:
    horizontal = trace.get("orientation") == "h"
    x, y = _values(trace.get("x")), _values(trace.get("y"))
    values, positions = (x, y) if horizontal else (y, x)
    if values is None:
        return
    if positions is None:
        positions = list(range(len(values)))
    base = _values(trace.get("base"))
    if base is None or not isinstance(base, list):
        base = [trace.get("base") or 0] * len(values)
    marker = trace.get("marker") or {}
    colors = marker.get("color")
    if isinstance(colors, (list, tuple)):
        colors = [_color(c) or default_color for c in colors]
    else:
        colors = _color(colors) or default_color
    width = trace.get("width")
    width = width if isinstance(width, (int, float)) else (0.8 if layout.get("barmode") != "group" else 0.4)
    keep = [i for i, (v, p) in enumerate(zip(values, positions)) if v is not None and p is not None]
    if not keep:  # a legend entry only: a patch of its colour, no bar
        from matplotlib.patches import Patch

        if label:
            patch = Patch(color=colors if isinstance(colors, str) else default_color, label=label)
            ax._minilm_legend = [*getattr(ax, "_minilm_legend", []), patch]  # noqa: SLF001
        return
    pick = lambda seq: [seq[i] for i in keep]  # noqa: E731
    color_arg = pick(colors) if isinstance(colors, list) else colors
    edge = (marker.get("line") or {}).get("color")
    common = {"color": color_arg, "label": label, "edgecolor": _color(edge) if isinstance(edge, str) else None,
              "linewidth": 0.5 if edge else 0}
    if horizontal:
        bars = ax.barh(pick(positions), pick(values), height=width, left=pick(base), **common)
    else:
        bars = ax.bar(pick(positions), pick(values), width=width, bottom=pick(base), **common)
    text = trace.get("text")
    if isinstance(text, (list, tuple)) and trace.get("textposition") != "none":
        # the bars' own labels (a cost per bar, say): often the point of the figure, so they stay
        labels = [_text(str(t)) if t is not None else "" for t in pick(list(text) + [None] * len(values))]
        ax.bar_label(bars, labels=labels, fontsize=8, padding=2)


def _draw_heatmap(ax, trace) -> None:
    import numpy as np
    from matplotlib.colors import LinearSegmentedColormap

    rows = _values(trace.get("z"))
    if not rows:
        return
    z = np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)
    if z.size == 0:
        return
    scale = trace.get("colorscale")
    cmap = "viridis"
    if isinstance(scale, (list, tuple)) and scale:
        cmap = LinearSegmentedColormap.from_list(
            "plotly", [(float(pos), _color(color) or "#000") for pos, color in scale]
        )
    x, y = _values(trace.get("x")), _values(trace.get("y"))
    extent = None
    numeric = lambda v: v is not None and all(isinstance(a, (int, float)) for a in v)  # noqa: E731
    if numeric(x) and numeric(y) and len(x) > 1 and len(y) > 1:
        dx, dy = (x[-1] - x[0]) / (len(x) - 1), (y[-1] - y[0]) / (len(y) - 1)
        extent = (x[0] - dx / 2, x[-1] + dx / 2, y[0] - dy / 2, y[-1] + dy / 2)
    image = ax.imshow(z, aspect="auto", origin="lower", cmap=cmap, extent=extent,
                      vmin=trace.get("zmin"), vmax=trace.get("zmax"), interpolation="nearest")
    if trace.get("showscale", True) is not False:
        ax.figure.colorbar(image, ax=ax, fraction=0.03, pad=0.01)


# -- text, shapes, legend --------------------------------------------------------------------------


def _annotate(canvas, layout) -> None:
    title = layout.get("title") or {}
    text = _text(title.get("text") or "")
    if text:
        canvas.suptitle(text, x=0.01, y=0.995, ha="left", va="top", fontsize=11)
    axes = {getattr(ax, "_plotly_refs", None): ax for ax in canvas.axes}
    for note in layout.get("annotations") or []:
        text = _text(note.get("text") or "")
        if not text:
            continue
        xref, yref = note.get("xref", "paper"), note.get("yref", "paper")
        if xref == "paper" and yref == "paper":
            canvas.text(*_paper_to_canvas(canvas, note.get("x", 0.5), note.get("y", 1.0)), text,
                        ha="center", va="bottom", fontsize=9)
        else:
            ax = axes.get((xref.split(" ")[0], yref.split(" ")[0]))
            if ax is not None and note.get("x") is not None and note.get("y") is not None:
                ax.annotate(text, (note["x"], note["y"]), fontsize=8, ha="center")
    for shape in layout.get("shapes") or []:
        if shape.get("type") != "line":
            continue
        xref = (shape.get("xref") or "x").split(" ")[0]
        yref = (shape.get("yref") or "y").split(" ")[0]
        ax = axes.get((xref, yref))
        if ax is None:
            continue
        line = shape.get("line") or {}
        style = {"color": _color(line.get("color")) or "gray",
                 "linestyle": DASHES.get(line.get("dash") or "solid", "-"), "linewidth": line.get("width") or 1}
        if shape.get("y0") == shape.get("y1") and "domain" in (shape.get("xref") or ""):
            ax.axhline(shape["y0"], **style)
        elif shape.get("x0") == shape.get("x1") and "domain" in (shape.get("yref") or ""):
            ax.axvline(shape["x0"], **style)
        else:
            ax.plot([shape.get("x0"), shape.get("x1")], [shape.get("y0"), shape.get("y1")], **style)


def _paper_to_canvas(canvas, x: float, y: float) -> tuple[float, float]:
    """Plotly's paper coordinates span the plot area; matplotlib's figure coordinates the canvas."""
    boxes = [ax.get_position() for ax in canvas.axes]
    x0, x1 = min(b.x0 for b in boxes), max(b.x1 for b in boxes)
    y0, y1 = min(b.y0 for b in boxes), max(b.y1 for b in boxes)
    return x0 + x * (x1 - x0), y0 + y * (y1 - y0)


def _legend(canvas, axes, layout, spec) -> None:
    if not _legend_labels(spec, layout):
        return
    handles, labels = [], []
    for ax in axes.values():
        found = ax.get_legend_handles_labels()
        extra = getattr(ax, "_minilm_legend", [])
        for handle, label in zip([*extra, *found[0]], [h.get_label() for h in extra] + found[1]):
            if label and not label.startswith("_") and label not in labels:
                handles.append(handle)
                labels.append(label)
    if labels:  # under the title, above the plots (room made in _make_axes)
        title_lines = len(_text(((layout.get("title") or {}).get("text")) or "").splitlines())
        anchor = 1 - (10 + 16 * title_lines) / (canvas.get_figheight() * DPI)
        canvas.legend(handles, labels, loc="upper center", ncol=min(len(labels), LEGEND_COLUMNS),
                      fontsize=8, frameon=False, bbox_to_anchor=(0.5, anchor))


# -- values --------------------------------------------------------------------------------------


def _values(value):
    """Plotly JSON stores arrays as lists, numpy arrays or {"dtype", "bdata"} dicts."""
    if value is None:
        return None
    if isinstance(value, dict) and "bdata" in value:
        import numpy as np

        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        if "shape" in value:
            array = array.reshape([int(s) for s in str(value["shape"]).split(",")])
        return array.tolist()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    return value


def _color(color) -> str | tuple | None:
    if not isinstance(color, str):
        return None
    match = re.fullmatch(r"rgba?\(([^)]*)\)", color.replace(" ", ""))
    if match:
        parts = [float(p) for p in match.group(1).split(",")]
        rgb = tuple(p / 255 for p in parts[:3])
        return (*rgb, parts[3]) if len(parts) == 4 else rgb
    return color


def _text(text: str) -> str:
    """Plotly's small HTML subset to plain lines."""
    text = re.sub(r"<br\s*/?>", "\n", text)
    return re.sub(r"<[^>]+>", "", text).strip()


def use_png_renderer() -> None:
    """Register "minilm_png" with plotly and make it the default renderer."""
    import plotly.io as pio
    from plotly.io._base_renderers import MimetypeRenderer  # plotly checks the renderer's type

    class PngRenderer(MimetypeRenderer):
        """`fig.show()` displays the PNG bundle."""

        def to_mimebundle(self, fig_dict: dict) -> dict[str, Any]:
            return png_bundle(fig_dict)

    pio.renderers["minilm_png"] = PngRenderer()
    pio.renderers.default = "minilm_png"
