"""The ledger dashboard: the seed's three-mode demo, drawn from a ladder measured on the engine.

Contract: `LedgerDashboard(results, prices, ...)` shows a measured technique ladder
(`ledger.ladder.run_ladder`) in three modes, each a plain plotly figure (`figure(mode)`, no
frontend needed) and, in `widget()`, a live tab with a price panel shared by all three:

    mode 1  the optimization pipeline   tick techniques on; throughput and cost per Mtok of the
                                        rung they make, the books (margin, break-even, GPUs)
    mode 2  KV cache reuse              tokens fed through the model per output token, prompt
                                        tokens served from the prefix cache, TTFT, peak KV
                                        blocks (memory) of the paged engine
    mode 3  continuous batching         the live batch view of a real engine (when an `llm` is
                                        given) beside static batching's seats on the same
                                        lengths; tables turned per minute, measured

Every number comes from the ladder's measurements (with their provenance) and the prices; the
dashboard runs nothing but the optional live engine of mode 3.  `show()` displays the widget,
or the three static figures and the books where no widget frontend is attached.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from importlib import resources

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minilm_engine.course.experiments.batching import occupancy_figure
from minilm_engine.course.experiments.toy_simulator import simulate
from minilm_engine.course.ledger.books import Ledger, gpus_needed, monthly_cost
from minilm_engine.course.ledger.ladder import RungResult, ladder_workload, results_from_json
from minilm_engine.course.ledger.prices import Prices
from minilm_engine.course.viz.live import live_figure, update_live_figure

MODES = ("optimization pipeline", "KV cache reuse", "continuous batching")
TAB_TITLES = ("1 · pipeline", "2 · KV cache reuse", "3 · batching")  # short: tabs are narrow
DEFAULT_PRICES = Prices(gpu_cost_per_hour=0.10, input_price_per_mtok=0.25,
                        output_price_per_mtok=1.0, cached_input_discount=0.5, batch_discount=0.5)
MEASURED_LADDER = "ladder_cpu.json"  # in minilm_engine/course/ledger/measured/, by make_figures.py
SELECTED, OTHER, MISSING = "#0969DA", "#AFC6E9", "#6E7781"


def load_measured_ladder(name: str = MEASURED_LADDER) -> list[RungResult]:
    """The ladder measured when the package was released (see figures/README.md)."""
    text = resources.files("minilm_engine.course.ledger").joinpath("measured", name).read_text()
    return results_from_json(json.loads(text))


class LedgerDashboard:
    """Three views of one measured ladder at one price list (see the module docstring).

    Args:
        results: the measured ladder (`run_ladder`), or None for the one shipped with the package.
        prices: the price list the books start with (the widget's inputs change it).
        llm: a continuous-strategy `LLM` for mode 3's live batch view; the workload's requests
            are added to its engine, for the learner to Step or Run.
        workload: the ladder's workload (its output lengths set mode 3's seats); by default
            `ladder_workload()` as measured.
        num_seats: seats of mode 3's static and continuous batches.
        target_tokens_per_s: the load the books size a fleet for.
    """

    def __init__(
        self, results: Sequence[RungResult] | None = None, prices: Prices = DEFAULT_PRICES,
        llm=None, workload=None, num_seats: int = 8, target_tokens_per_s: float = 10_000.0,
    ):
        self.results = list(results) if results is not None else load_measured_ladder()
        if not self.results or not self.results[0].available:
            raise ValueError("the ladder's first rung must be measured: every other starts from it")
        if not isinstance(prices, Prices):
            raise TypeError(f"prices must be a ledger.Prices, got {type(prices).__name__}")
        self.prices = prices
        self.target_tokens_per_s = target_tokens_per_s
        self.workload = workload or ladder_workload(self.results[0].measurement.num_requests)
        self.num_seats = num_seats
        # Rung 0 is the starting point; ticking technique k means "rung k is in the pipeline".
        self.enabled = [r.available for r in self.results[1:]]
        self.llm = llm
        self._live_view = None
        self._widgets: dict[str, object] = {}
        self._figure_widgets: dict[str, object] = {}  # mode -> live figure widget
        if llm is not None:
            for i, (prompt, params) in enumerate(zip(self.workload.prompts,
                                                     self.workload.sampling_params)):
                llm.engine.add_request(f"d{i}", prompt, params)

    # -- the state ----------------------------------------------------------------------------

    @property
    def selected_index(self) -> int:
        """The rung the ticked techniques build: the first rung plus every technique ticked in
        order, up to the first one not ticked (each rung was measured with all the ones before
        it that this version has; a rung it lacks is passed over, as `ladder.compose` did)."""
        index = 0
        for k, on in enumerate(self.enabled, start=1):
            if not self.results[k].available:
                continue
            if not on:
                break
            index = k
        return index

    @property
    def selected(self) -> RungResult:
        return self.results[self.selected_index]

    def set_technique(self, name: str, on: bool) -> None:
        """Tick (or untick) the technique a rung adds, by the rung's name."""
        names = [r.rung.name for r in self.results[1:]]
        if name not in names:
            raise ValueError(f"no technique {name!r}; the ladder has {names}")
        k = names.index(name)
        if on and not self.results[k + 1].available:
            raise ValueError(f"{name!r} was not measured: {self.results[k + 1].reason}")
        self.enabled[k] = bool(on)

    def books(self, result: RungResult | None = None) -> Ledger:
        result = result or self.selected
        return Ledger(result.measurement, self.prices)

    def books_rows(self) -> list[tuple[str, str]]:
        """The selected rung's books, as (figure, value) pairs in words."""
        r, p = self.selected, self.prices
        books, m = self.books(r), r.measurement
        rows = [
            ("configuration", r.rung.name),
            ("output tokens/s", f"{m.output_tokens_per_s:,.1f}"),
            ("cost per Mtok output (all costs on output)", p.money(books.blended_cost_per_mtok, 3)),
        ]
        if books.input_token_weight is not None:
            rows += [("cost per Mtok input / output (split by measured step time)",
                      f"{p.money(books.input_cost_per_mtok, 3)} / "
                      f"{p.money(books.output_cost_per_mtok, 3)}")]
        if p.has_token_prices:
            b_in, b_out = books.break_even_prices()
            rows += [
                ("margin at your prices", f"{books.margin():+.0%}"),
                ("break-even prices per Mtok (input / output)",
                 f"{p.money(b_in, 3)} / {p.money(b_out, 3)}"),
            ]
            if p.batch_discount:
                rows.append(("margin in the batch tier", f"{books.margin(batch_tier=True):+.0%}"))
        num = gpus_needed(self.target_tokens_per_s, m.output_tokens_per_s / m.num_gpus)
        rows += [
            (f"machines for {self.target_tokens_per_s:,.0f} output tokens/s",
             f"{num:,} (no latency limit: all requests were sent at once)"),
            ("monthly rent of that fleet", p.money(monthly_cost(num, p.gpu_cost_per_hour), 0)),
            ("measured", m.provenance.describe()),
        ]
        return rows

    def books_html(self) -> str:
        cells = "".join(
            f"<tr><td style='padding:1px 10px 1px 0'>{html.escape(k)}</td>"
            f"<td><b>{html.escape(v)}</b></td></tr>" for k, v in self.books_rows())
        return f"<table class='ledger-books'>{cells}</table>"

    # -- the figures ----------------------------------------------------------------------------

    def figure(self, mode: str = MODES[0]) -> go.Figure:
        if mode == MODES[0]:
            return self._pipeline_figure()
        if mode == MODES[1]:
            return self._reuse_figure()
        if mode == MODES[2]:
            return self._batching_figure()
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")

    def _color(self, result: RungResult) -> str:
        if result is self.selected:
            return SELECTED
        return OTHER if result.available else MISSING

    @staticmethod
    def _bars(results: list[RungResult], values: list[float], texts: list[str], colors: list[str],
              name: str) -> go.Bar:
        """Horizontal bars, one per rung, the rung's name on the y axis (long names stay
        readable in every renderer, the static PNG one included)."""
        return go.Bar(y=[r.rung.name for r in results], x=values, orientation="h",
                      marker_color=colors, text=texts, textposition="outside",
                      cliponaxis=False, name=name, showlegend=False)

    def _pipeline_figure(self) -> go.Figure:
        p, results = self.prices, self.results
        colors = [self._color(r) for r in results]
        tps = [r.measurement.output_tokens_per_s if r.available else 0 for r in results]
        costs = [self.books(r).blended_cost_per_mtok if r.available else 0 for r in results]
        fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.12,
                            subplot_titles=("output tokens/s",
                                            f"cost per million output tokens ({p.currency})"))
        fig.add_trace(self._bars(
            results, tps, [f"{v:,.0f}" if r.available else "not in this version"
                           for v, r in zip(tps, results)], colors, "tokens/s"), 1, 1)
        fig.add_trace(self._bars(
            results, costs, [p.money(c, 3) if r.available else "n/a"
                             for c, r in zip(costs, results)], colors, "cost"), 1, 2)
        price = p.output_price_per_mtok
        names = [r.rung.name for r in results]
        fig.add_trace(go.Scatter(  # the market price: right of it, every token loses money
            x=[price or 0, price or 0], y=[names[0], names[-1]], mode="lines",
            line=dict(color="#CF222E", dash="dash", width=1.5), opacity=0.7, name=f"your output price ({p.money(price or 0)} per Mtok)",
            visible=price is not None, showlegend=True), 1, 2)
        # Room on the right for the labels drawn outside the bars (a static renderer clips them).
        fig.update_xaxes(range=[0, 1.3 * max(tps + [1e-9])], row=1, col=1)
        fig.update_xaxes(range=[0, 1.35 * max(costs + [price or 0, 1e-9])], row=1, col=2)
        r, k = self.selected, self.selected_index
        fig.update_layout(
            title=dict(text=(
                f"Optimization pipeline: {r.rung.name} — {tps[k]:,.0f} tokens/s "
                f"({tps[k] / tps[0]:.1f}x the first rung), {p.money(costs[k], 3)} per Mtok"
                f"<br><sub>{html.escape(r.measurement.provenance.machine)}, model "
                f"{html.escape(r.measurement.provenance.model)}; machine cost "
                f"{p.money(p.gpu_cost_per_hour)}/h at {p.utilization:.0%} utilization</sub>"),
                x=0.01, font=dict(size=14)),
            height=440, margin=dict(t=110, l=170, r=60),
            showlegend=price is not None,  # the dashed line's label: a legend of its own
            legend=dict(orientation="h", y=1.12, x=1, xanchor="right"),
            uirevision="pipeline",
        )
        fig.update_yaxes(autorange="reversed")  # the first rung on top
        fig.update_xaxes(rangemode="tozero")
        return fig

    def _reuse_figure(self) -> go.Figure:
        shown = [r for r in self.results
                 if r.available and r.measurement.num_computed_tokens is not None]
        paged = [r for r in shown if r.measurement.peak_kv_blocks is not None]  # counts blocks
        colors = [self._color(r) for r in shown]
        per_output = [r.measurement.num_computed_tokens / r.measurement.num_output_tokens
                      for r in shown]
        cached = [r.measurement.num_cached_input_tokens for r in shown]
        ttft = [1e3 * (r.measurement.mean_ttft_s or 0) for r in shown]
        blocks = [r.measurement.peak_kv_blocks for r in paged]
        fig = make_subplots(rows=2, cols=2, horizontal_spacing=0.3, vertical_spacing=0.22,
                            subplot_titles=("tokens computed per output token",
                                            "prompt tokens from the prefix cache",
                                            "mean time to first token (ms)",
                                            "peak KV blocks in use (paged engine)"))
        fig.add_trace(self._bars(shown, per_output, [f"{v:,.1f}" for v in per_output], colors,
                                 "computed"), 1, 1)
        fig.add_trace(self._bars(shown, cached, [f"{v:,}" for v in cached], colors, "reused"),
                      1, 2)
        fig.add_trace(self._bars(shown, ttft, [f"{v:,.0f}" for v in ttft], colors, "TTFT"), 2, 1)
        fig.add_trace(self._bars(paged, blocks, [str(v) for v in blocks],
                                 [self._color(r) for r in paged], "KV blocks"), 2, 2)
        by_name = {r.rung.name: r.measurement for r in shown}
        summary = " · ".join(
            f"{n}: {by_name[n].num_computed_tokens / by_name[n].num_output_tokens:,.1f}"
            for n in ("no KV cache", "KV cache", "+ prefix caching") if n in by_name)
        fig.update_layout(
            title=dict(text=f"KV cache reuse: tokens computed per output token — {summary}"
                            "<br><sub>the broth made once: keys and values kept (KV cache) and "
                            "shared between requests (prefix caching)</sub>",
                       x=0.01, font=dict(size=14)),
            height=560, margin=dict(t=90, l=170, r=60), uirevision="reuse")
        fig.update_yaxes(autorange="reversed")
        for (row, col), values in (((1, 1), per_output), ((1, 2), cached), ((2, 1), ttft), ((2, 2), blocks)):
            # room for the outside labels, and few enough ticks that wide numbers do not collide
            fig.update_xaxes(range=[0, 1.3 * max(list(values) + [1e-9])], nticks=4, row=row, col=col)
        return fig

    def tables_per_minute(self) -> dict[str, float]:
        """Requests finished per minute ("tables turned"), measured, static vs continuous."""
        out = {}
        for label, name in (("static", "static batching"), ("continuous", "continuous batching")):
            m = next((r.measurement for r in self.results if r.rung.name == name and r.available),
                     None)
            if m is not None:
                out[label] = 60 * m.requests_per_s
        return out

    def _batching_figure(self) -> go.Figure:
        lens = self.workload.output_lens
        sims = [simulate(lens, self.num_seats, "static"), simulate(lens, self.num_seats, "continuous")]
        turned = self.tables_per_minute()
        measured = ", ".join(f"{k} {v:,.0f}" for k, v in turned.items())
        gain = (f" ({turned['continuous'] / turned['static']:.1f}x)"
                if len(turned) == 2 else "")
        return occupancy_figure(
            sims, title=f"Continuous batching: tables turned per minute, measured: "
                        f"{measured or 'not measured'}{gain}")

    # -- the widget -----------------------------------------------------------------------------

    def widget(self):
        """Tabs for the three modes under one price panel; every input redraws at once."""
        import ipywidgets as widgets

        p = self.prices
        w = self._widgets
        w["gpu_cost"] = widgets.BoundedFloatText(value=p.gpu_cost_per_hour, min=0.0001, max=1e6,
                                                 step=0.01, description="machine / h")
        w["utilization"] = widgets.FloatSlider(value=p.utilization, min=0.05, max=1.0, step=0.05,
                                               description="utilization")
        w["input_price"] = widgets.BoundedFloatText(value=p.input_price_per_mtok or 0, min=0,
                                                    max=1e6, step=0.05, description="input / Mtok")
        w["output_price"] = widgets.BoundedFloatText(value=p.output_price_per_mtok or 0, min=0,
                                                     max=1e6, step=0.05,
                                                     description="output / Mtok")
        w["currency"] = widgets.Text(value=p.currency, description="currency",
                                     layout=widgets.Layout(width="160px"))
        w["target"] = widgets.BoundedFloatText(value=self.target_tokens_per_s, min=1, max=1e9,
                                               description="load tok/s")
        w["books"] = widgets.HTML(self.books_html())
        for key in ("gpu_cost", "utilization", "input_price", "output_price", "currency", "target"):
            w[key].observe(lambda _: self._on_prices(), names="value")
        toggles = []
        for k, r in enumerate(self.results[1:]):
            box = widgets.Checkbox(value=self.enabled[k], disabled=not r.available, indent=False,
                                   description=r.rung.name + ("" if r.available
                                                              else " (not in this version)"),
                                   layout=widgets.Layout(width="auto"))
            box.observe(lambda change, name=r.rung.name: self._on_toggle(name, change["new"]),
                        names="value")
            toggles.append(box)
        w["toggles"] = toggles
        prices_box = widgets.VBox([
            widgets.HBox([w["gpu_cost"], w["utilization"], w["currency"]]),
            widgets.HBox([w["input_price"], w["output_price"], w["target"]]),
        ])
        pages = []
        for mode in MODES:
            self._figure_widgets[mode] = live_figure(self.figure(mode))
        pages.append(widgets.VBox([widgets.HBox(toggles, layout=widgets.Layout(flex_flow="wrap")),
                                   self._figure_widgets[MODES[0]], w["books"]]))
        pages.append(widgets.VBox([self._figure_widgets[MODES[1]]]))
        batching = [self._figure_widgets[MODES[2]]]
        if self.llm is not None:
            from minilm_engine.course.viz.batch_view import BatchView

            self._live_view = BatchView(self.llm.engine)
            batching.insert(0, self._live_view.widget())
        pages.append(widgets.VBox(batching))
        tabs = widgets.Tab(children=pages)
        for i, title in enumerate(TAB_TITLES):
            tabs.set_title(i, title)
        w["tabs"] = tabs
        return widgets.VBox([prices_box, tabs])

    def _on_prices(self) -> None:
        w = self._widgets
        try:
            self.prices = Prices(
                gpu_cost_per_hour=w["gpu_cost"].value, currency=w["currency"].value,
                utilization=w["utilization"].value, input_price_per_mtok=w["input_price"].value,
                output_price_per_mtok=w["output_price"].value,
                cached_input_discount=self.prices.cached_input_discount,
                batch_discount=self.prices.batch_discount)
            self.target_tokens_per_s = float(w["target"].value)
        except ValueError as e:  # shown where the books are, the old prices stay
            w["books"].value = f"<b style='color:#C00'>{html.escape(str(e))}</b>"
            return
        self.redraw()

    def _on_toggle(self, name: str, on: bool) -> None:
        self.set_technique(name, on)
        self.redraw()

    def redraw(self) -> None:
        """Bring every live figure and the books up to date with the prices and toggles."""
        for mode in MODES[:2]:  # mode 3 depends on neither (its live view follows the engine)
            if mode in self._figure_widgets:
                update_live_figure(self._figure_widgets[mode], self.figure(mode))
        if "books" in self._widgets:
            self._widgets["books"].value = self.books_html()

    def show(self, mode: str | None = None) -> None:
        """The widget, or (MINILM_STATIC_FIGURES=1, or no frontend) the three figures and the
        books."""
        from IPython.display import HTML, display

        from minilm_engine.course.viz import default_mode, static_bundle

        if (mode or default_mode()) == "widget":
            display(self.widget())
            return
        for m in MODES:
            display(static_bundle(self.figure(m)), raw=True)
        display(HTML(self.books_html()))
