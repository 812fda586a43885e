"""What every view shares: a static figure, and a live widget that follows the engine step by step.

Contract: a view subclass implements `figure()` (a plain `plotly.graph_objects.Figure` built from
the engine's current state and trace, with the same traces in the same order every time).
`LiveView.widget()` wraps that figure in a `FigureWidget` (in Colab a `PlotlyAnyWidget`, see
frontend.py) plus `EngineControls`, and redraws it
after engine steps, at most every `throttle_s` seconds (and never spending more than about a fifth
of the time redrawing), always after the last step of a run, and, in a Jupyter kernel, shortly
after a burst of steps that a throttle skipped.

    engine.step() ──> StepTrace.append ──> LiveView._on_step ──(throttled)──> redraw()
                                                                              │
        figure()  (a fresh go.Figure)  ──copy traces and layout into──>  every FigureWidget

`EngineControls` drives the engine from the notebook: Step (one `engine.step()`), Run/Pause (an
asyncio task on the kernel's event loop that awaits `asyncio.sleep(delay)` between steps, so
the kernel stays responsive), and the delay slider.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Callable

import ipywidgets as widgets
import plotly.graph_objects as go

from minilm_engine.core.trace import StepRecord
from minilm_engine.course.viz.frontend import live_renderer


class EngineControls:
    """Step / Run-Pause / delay controls for one engine, and a one-line status.

    `on_update` is called after every step the controls run and when a run stops, so the views
    can redraw.  `task` is the asyncio task of the last Run (done once paused or finished).
    Run needs a running event loop, which a Jupyter kernel has; elsewhere it says so and stays off.
    """

    def __init__(self, engine, on_update: Callable[[], None], delay_s: float = 0.05):
        self.engine = engine
        self.on_update = on_update
        self.step_button = widgets.Button(
            description="Step", icon="step-forward", tooltip="one engine.step()"
        )
        self.run_button = widgets.ToggleButton(
            description="Run", icon="play", tooltip="step until every request is done"
        )
        self.delay_slider = widgets.FloatSlider(
            value=delay_s, min=0.0, max=1.0, step=0.01, description="delay (s)",
            readout_format=".2f",
        )
        self.status = widgets.HTML()
        self.box = widgets.HBox([self.step_button, self.run_button, self.delay_slider, self.status])
        self.task: asyncio.Task | None = None
        self._error: str | None = None  # the last step's exception, shown in the status line
        self.step_button.on_click(lambda _: self.step())
        self.run_button.observe(self._on_run_toggled, names="value")
        self.refresh_status()

    def step(self) -> None:
        """Run one engine step if any request is unfinished, then redraw."""
        if self.engine.has_unfinished_requests():
            self._safely(self.engine.step)
        self.on_update()
        self.refresh_status()

    def refresh_status(self, error: str | None = None) -> None:
        engine = self.engine
        # Inside a step callback the engine has not counted the step yet: read the trace too.
        records = engine.trace.records
        num_steps = max(engine.num_steps, records[-1].step + 1 if records else 0)
        text = (
            f"{num_steps} steps · running {len(engine.scheduler.running)}"
            f" · waiting {len(engine.scheduler.waiting)}"
        )
        if not engine.has_unfinished_requests():
            text += " · <i>no unfinished requests</i>"
        if error:
            text += f" · <b style='color:#C00'>{error}</b>"
        self.status.value = text

    # -- Run / Pause ----------------------------------------------------------------------

    def _on_run_toggled(self, change: dict) -> None:
        if not change["new"]:
            self.run_button.description, self.run_button.icon = "Run", "play"
            return
        try:
            loop = asyncio.get_running_loop()  # the kernel's loop, inside Jupyter
        except RuntimeError:
            self.run_button.value = False
            self.refresh_status("Run needs a running asyncio event loop (a Jupyter kernel)")
            return
        self.run_button.description, self.run_button.icon = "Pause", "pause"
        if self.task is None or self.task.done():
            self.task = loop.create_task(self._run())

    async def _run(self) -> None:
        """Step until paused or done; each `await` lets the kernel handle clicks and redraws."""
        try:
            while self.run_button.value and self.engine.has_unfinished_requests():
                if not self._safely(self.engine.step):
                    break
                self.refresh_status()
                await asyncio.sleep(self.delay_slider.value)
        finally:
            self.run_button.value = False
            self.on_update()
            self.refresh_status(self._error)

    def _safely(self, fn: Callable[[], object]) -> bool:
        """Call fn; on an exception show it in the status line (a widget callback has no
        traceback cell to print to) and return False."""
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - shown to the user, not swallowed
            self._error = f"{type(e).__name__}: {e}"
            self.refresh_status(self._error)
            return False
        self._error = None
        return True


class LiveView:
    """Base class of the views: `figure()` (static) and `widget()` (live, with controls)."""

    def __init__(self, engine, throttle_s: float = 0.1):
        """throttle_s: least time between two live redraws (0 = redraw after every step)."""
        if throttle_s < 0:
            raise ValueError(f"throttle_s must be >= 0, got {throttle_s}")
        if not engine.config.record_trace:
            raise ValueError(
                "this engine keeps no step trace (record_trace=False), and the views draw "
                "engine.trace: create the LLM with record_trace=True (the default)"
            )
        self.engine = engine
        self.throttle_s = throttle_s
        self.figure_widgets: list = []  # go.FigureWidget or PlotlyAnyWidget
        self.controls: list[EngineControls] = []
        self.num_redraws = 0
        self._listening = False
        self._last_redraw_end = float("-inf")
        self._last_redraw_cost = 0.0
        self._pending_flush: asyncio.TimerHandle | None = None
        self._stale = False  # a step ran since the last redraw
        self.draw_error: str | None = None  # the last redraw's exception, if any

    def figure(self) -> go.Figure:
        raise NotImplementedError

    def widget(self, controls: bool = True) -> widgets.VBox:
        """A live figure (with Step / Run / delay controls unless controls=False): a
        FigureWidget, or in Colab an anywidget view (`frontend.live_renderer()`)."""
        figure_widget = live_figure(self.figure())
        self.figure_widgets.append(figure_widget)
        self._last_redraw_end = time.perf_counter()  # it was just drawn
        if not self._listening:
            self.engine.add_step_callback(self._on_step)
            self._listening = True
        children: list[widgets.Widget] = [figure_widget]
        if controls:
            control = EngineControls(self.engine, on_update=self.flush)
            self.controls.append(control)
            children.insert(0, control.box)
        return widgets.VBox(children)

    def flush(self) -> None:
        """Redraw now if a step ran since the last redraw (a throttle skipped it)."""
        if self._stale:
            self.redraw()

    def redraw(self) -> None:
        """Copy a fresh `figure()` into every live FigureWidget now."""
        if self._pending_flush is not None:
            self._pending_flush.cancel()
            self._pending_flush = None
        if not self.figure_widgets:
            return
        start = time.perf_counter()
        fresh = self.figure()
        for figure_widget in self.figure_widgets:
            update_live_figure(figure_widget, fresh)
        for control in self.controls:
            control.refresh_status()
        self.num_redraws += 1
        self._stale = False
        self._last_redraw_end = time.perf_counter()
        self._last_redraw_cost = self._last_redraw_end - start

    def close(self) -> None:
        """Stop following the engine and close the live widgets."""
        if self._listening:
            self.engine.remove_step_callback(self._on_step)
            self._listening = False
        if self._pending_flush is not None:
            self._pending_flush.cancel()
            self._pending_flush = None
        for control in self.controls:
            control.run_button.value = False
            control.box.close()
        for figure_widget in self.figure_widgets:
            figure_widget.close()
        self.figure_widgets.clear()
        self.controls.clear()

    def _on_step(self, record: StepRecord) -> None:
        """The engine's step callback: it runs inside `engine.step()`, so it must be cheap
        and must never raise (a drawing bug must not stop generation)."""
        if not self.figure_widgets:
            return
        self._stale = True
        # Wait at least throttle_s, and 4x the last redraw's cost, so that redrawing takes at
        # most ~20% of a fast engine's time; throttle_s=0 redraws after every step.
        wait = max(self.throttle_s, 4 * self._last_redraw_cost) if self.throttle_s > 0 else 0.0
        since_last = time.perf_counter() - self._last_redraw_end
        if self.engine.has_unfinished_requests() and since_last < wait:
            self._schedule_flush(wait - since_last)
            return
        try:
            self.redraw()
        except Exception as e:  # noqa: BLE001 - reported in the status line and as a warning
            self.draw_error = f"{type(e).__name__}: {e}"
            warnings.warn(f"{type(self).__name__} could not redraw: {self.draw_error}", stacklevel=2)
            for control in self.controls:
                control.refresh_status(self.draw_error)

    def _schedule_flush(self, delay: float) -> None:
        """Redraw once the kernel is idle again, so a throttled last step still shows."""
        if self._pending_flush is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop (a script, a test): the caller redraws when it wants to
        self._pending_flush = loop.call_later(delay, self.flush)


def live_figure(figure: go.Figure):
    """A widget showing `figure` that this frontend can draw: a FigureWidget, or in Colab a
    `PlotlyAnyWidget` (see frontend.py).  Redraw it with `update_live_figure`."""
    if live_renderer() == "anywidget":
        from minilm_engine.course.viz.anywidget_figure import PlotlyAnyWidget

        return PlotlyAnyWidget(figure)
    return go.FigureWidget(figure)


def update_live_figure(widget, figure: go.Figure) -> None:
    """Make a widget from `live_figure` show `figure` (same traces in the same order)."""
    if isinstance(widget, go.FigureWidget):
        _copy_figure(figure, widget)
    else:
        widget.show_figure(figure)


def _copy_figure(source: go.Figure, target: go.FigureWidget) -> None:
    """Make `target` show `source`; both must have the same traces in the same order."""
    if len(source.data) != len(target.data):
        raise ValueError(f"figure has {len(source.data)} traces, the widget {len(target.data)}")
    with target.batch_update():
        for new, old in zip(source.data, target.data):
            old.update(new.to_plotly_json(), overwrite=True)
        layout = source.layout.to_plotly_json()
        layout.pop("template", None)  # the same every time, and the costliest part to validate
        target.layout.update(layout, overwrite=True)

