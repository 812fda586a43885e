"""The live widgets in a real browser: JupyterLab, a kernel, and headless Chromium via Playwright.

`test_viz.py` checks the figures and the widget objects from Python; this test checks what only a
browser can: that JupyterLab's widget manager, anywidget and plotly.js really draw the
`BatchView` and `MemoryView` widgets, and that clicking Step in the page runs the engine in the
kernel and redraws the figures; and that the ledger dashboard's checkboxes and price inputs
redraw its figure and books.

    pytest (this file) ──starts──> jupyter lab (own port, token, root dir, settings dirs)
                       ──drives──> Chromium: open the notebook, Run > Run All Cells, click Step
                       ──reads───> the DOM: plotly's SVG, its bars, titles and heatmap image

Needs Debian's Chromium at /usr/bin/chromium (or $MINILM_CHROMIUM) and the `playwright` Python
package (in the `test` extra; Playwright's own browser download is never used).  In CI
(`CI=true`, where `.ci/run` installs Chromium with `.ci/install_browser.sh`) a missing browser
makes the test FAIL, saying what to install; on a contributor's machine without Chromium it is
skipped with the same message, so `python3 dev.py test` works on a fresh laptop.  Skip it
explicitly with `MINILM_SKIP_BROWSER=1`, or deselect it with `-m "not browser"`.  A screenshot of the notebook goes to the test's
`tmp_path` (`notebook.png`), on failure too, with the JupyterLab server log (`jupyter.log`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SKIP_ENV_VAR = "MINILM_SKIP_BROWSER"
CHROMIUM = os.environ.get("MINILM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]
NUM_STEPS = 3  # Step clicks in the BatchView
SERVER_START_TIMEOUT_S = 40
KERNEL_RUN_TIMEOUT_MS = 120_000  # (a loaded 2-core CI machine doubles the quiet ~30 s) kernel start + import torch + load the model + both widgets
UPDATE_TIMEOUT_MS = 15_000  # one Step click until the redrawn figure is in the page

# The notebook: cell 0 builds the engine, cell 1 shows the BatchView, cell 2 the MemoryView,
# cell 3 the ledger dashboard.
SETUP_SOURCE = """\
import torch
torch.set_num_threads(1)
from minilm_engine import LLM, SamplingParams
from minilm_engine.course import viz
llm = LLM(max_num_seqs=4, num_kv_blocks=64)
params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
for i, prompt in enumerate(["Order for table 7:", "Hello", "A bowl of noodles, please."]):
    llm.engine.add_request(f"r{i}", prompt, params)
"""
BATCH_SOURCE = """\
view = viz.BatchView(llm.engine)
w = view.widget()
w
"""
MEMORY_SOURCE = """\
memory = viz.MemoryView(llm.engine)
mw = memory.widget()
mw
"""
# Cell 3: the ledger dashboard on the ladder shipped with the package, its own live engine.
DASHBOARD_SOURCE = """\
from minilm_engine.course.viz.dashboard import LedgerDashboard
dashboard = LedgerDashboard(llm=LLM(max_num_seqs=8, num_kv_blocks=128))
dashboard.widget()
"""
CELL_SOURCES = [SETUP_SOURCE, BATCH_SOURCE, MEMORY_SOURCE, DASHBOARD_SOURCE]

# JupyterLab user settings: all cells attached to the DOM (the default windowing leaves
# offscreen cells unrendered), and no news / update notifications over the page.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}

# JS run in the page: the plotly figure's title and the number of drawn bars in one output.
FIGURE_STATE_JS = """(output) => {
    const plot = output.querySelector('.js-plotly-plot');
    if (!plot) return null;
    const title = plot.querySelector('.gtitle');
    return {
        title: title ? title.textContent : '',
        bars: plot.querySelectorAll('.barlayer .point').length,
        svgs: plot.querySelectorAll('svg.main-svg').length,
    };
}"""


try:  # imported here only for its exception class; _require_browser reports it missing
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
except ImportError:  # pragma: no cover
    PlaywrightTimeoutError = TimeoutError


def _require_browser():
    """Return playwright's sync_playwright; without a browser, fail in CI and skip elsewhere."""
    if os.environ.get(SKIP_ENV_VAR, "").strip() == "1":
        pytest.skip(f"{SKIP_ENV_VAR}=1: browser test skipped")
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
        missing.append("the playwright Python package (pip install -e '.[test]')")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing.append(
            f"Chromium at {CHROMIUM} (sudo .ci/install_browser.sh, or set MINILM_CHROMIUM)"
        )
    if missing:
        message = "the browser test needs " + " and ".join(missing)
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message + " (it runs in CI)")
    return sync_playwright


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_notebook(path: Path) -> None:
    cells = [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": f"cell-{i}",
            "metadata": {},
            "outputs": [],
            "source": source.splitlines(keepends=True),
        }
        for i, source in enumerate(CELL_SOURCES)
    ]
    notebook = {
        "cells": cells,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(notebook, indent=1))


class LabServer:
    """`jupyter lab` on a free port, with its own token, root dir and config/data/settings dirs."""

    def __init__(self, root: Path, home: Path, log_path: Path):
        self.root, self.log_path = root, log_path
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        settings = home / "lab-settings"
        for rel, values in LAB_SETTINGS.items():
            (settings / rel).parent.mkdir(parents=True, exist_ok=True)
            (settings / rel).write_text(json.dumps(values))
        env = dict(os.environ)
        env.update(
            JUPYTER_CONFIG_DIR=str(home / "config"),
            JUPYTER_DATA_DIR=str(home / "data"),
            JUPYTER_RUNTIME_DIR=str(home / "runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(settings),
            JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        env.pop("MINILM_STATIC_FIGURES", None)
        command = [
            sys.executable, "-m", "jupyter", "lab", "--no-browser",
            f"--port={self.port}", "--ServerApp.port_retries=0",
            # IdentityProvider.token is ServerApp.token's non-deprecated name (jupyter_server 2)
            f"--IdentityProvider.token={self.token}", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.root_dir={root}",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI containers run as root
            command.append("--allow-root")
        self.log = open(log_path, "w")  # noqa: SIM115 - open while the server runs; stop() closes
        self.proc = subprocess.Popen(
            command,
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log_tail(self, num_chars: int = 3000) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def api(self, path: str, method: str = "GET", timeout: float = 5.0):
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()

    def wait_until_up(self, timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                status, _ = self.api("/api/status", timeout=2.0)
                if status == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"jupyter lab did not answer within {timeout_s}s:\n{self.log_tail()}"
                )
            time.sleep(0.2)  # polling interval of the readiness probe

    def stop(self) -> None:
        """Shut the server and its kernels down: the REST shutdown first, then signals."""
        try:
            if self.proc.poll() is None:
                try:
                    self.api("/api/shutdown", method="POST", timeout=5.0)
                except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGTERM)
                    try:
                        self.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        os.killpg(self.proc.pid, signal.SIGKILL)
                        self.proc.wait(timeout=5)
        finally:
            self.log.close()


def _outputs(page):
    """The output area of each notebook cell, in order."""
    return page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell .jp-OutputArea")


def _run_all_cells(page, attempts: int = 3) -> None:
    """Run > Run All Cells through the menu bar, once the kernel is ready.

    Ready means the status bar's kernel item reads "... | Idle": the notebook toolbar's
    execution indicator says "idle" already while the kernel still initializes, and a Run All
    clicked then silently runs nothing.  Should the run still not start (no "[*]" / "[1]"
    prompt on the first cell), the click is repeated, which cannot run a cell twice.
    """
    page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\|\s*Idle$")).wait_for(
        timeout=30_000
    )
    first_prompt = page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell .jp-InputPrompt").first
    for attempt in range(1, attempts + 1):
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
        try:
            page.wait_for_function(
                "(prompt) => /\\[(\\*|\\d+)\\]/.test(prompt.textContent)",
                arg=first_prompt.element_handle(),
                timeout=10_000,
            )
            return
        except PlaywrightTimeoutError:
            if attempt == attempts:
                raise


def _figure_state(output) -> dict | None:
    return output.evaluate(FIGURE_STATE_JS)


def _wait_for_title(page, output, text: str, timeout_ms: int = UPDATE_TIMEOUT_MS) -> None:
    """Wait until the plotly title in `output` contains `text`."""
    page.wait_for_function(
        """([output, text]) => {
            const title = output.querySelector('.js-plotly-plot .gtitle');
            return title !== null && title.textContent.includes(text);
        }""",
        arg=[output.element_handle(), text],
        timeout=timeout_ms,
    )


def _wait_for_title_without(page, output, text: str, timeout_ms: int = UPDATE_TIMEOUT_MS) -> None:
    page.wait_for_function(
        """([output, text]) => {
            const title = output.querySelector('.js-plotly-plot .gtitle');
            return title !== null && !title.textContent.includes(text);
        }""",
        arg=[output.element_handle(), text],
        timeout=timeout_ms,
    )


def test_live_widgets_render_and_update_in_jupyterlab(tmp_path):
    sync_playwright = _require_browser()
    root = tmp_path / "lab"
    root.mkdir()
    _write_notebook(root / "widgets.ipynb")
    screenshot = tmp_path / "notebook.png"
    server = LabServer(root, tmp_path / "jupyter-home", tmp_path / "jupyter.log")
    console_errors: list[str] = []
    page = None
    try:
        server.wait_until_up()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1900})
                page.on(
                    "console",
                    lambda m: console_errors.append(m.text) if m.type == "error" else None,
                )
                page.on("pageerror", lambda e: console_errors.append(f"pageerror: {e}"))
                _run_notebook_and_check(page, server)
                page.screenshot(path=str(screenshot))
            except Exception as e:
                if page is not None:
                    with contextlib.suppress(Exception):  # the original error matters more
                        page.screenshot(path=str(screenshot))
                raise AssertionError(
                    f"{type(e).__name__}: {e}\n\nscreenshot: {screenshot}\n"
                    f"browser console errors (last 10): {console_errors[-10:]}\n"
                    f"jupyter log tail:\n{server.log_tail()}"
                ) from e
            finally:
                browser.close()
    finally:
        server.stop()


def _run_notebook_and_check(page, server: LabServer) -> None:
    page.goto(f"{server.url}/lab/tree/widgets.ipynb?token={server.token}", timeout=30_000)
    outputs = _outputs(page)
    page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").nth(len(CELL_SOURCES) - 1).wait_for(
        state="attached", timeout=30_000
    )
    _run_all_cells(page)

    batch, memory = outputs.nth(1), outputs.nth(2)
    # Every cell has run once the last one (the dashboard) is drawn: until then the kernel is
    # busy, and the widgets above wait for it to send their figures.
    outputs.nth(3).locator(".js-plotly-plot svg.main-svg").first.wait_for(
        state="attached", timeout=KERNEL_RUN_TIMEOUT_MS)
    page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\|\s*Idle$")).wait_for(
        timeout=KERNEL_RUN_TIMEOUT_MS)
    # Both widgets drawn: plotly's SVG inside each widget output.
    batch.locator(".js-plotly-plot svg.main-svg").first.wait_for(timeout=KERNEL_RUN_TIMEOUT_MS)
    memory.locator(".js-plotly-plot svg.main-svg").first.wait_for(timeout=UPDATE_TIMEOUT_MS)
    _wait_for_title(page, batch, "no step yet")
    _wait_for_title(page, memory, "no running request")
    for output in (batch, memory):
        text = output.inner_text()
        assert "Error displaying widget" not in text and "Failed to load" not in text, text

    # The controls, and the figure before any step (its bar count is the baseline: plotly draws
    # a point or two for the legend-only and empty traces).
    step_button = batch.get_by_role("button", name="Step")
    step_button.wait_for(timeout=UPDATE_TIMEOUT_MS)
    assert batch.get_by_role("button", name="Run").count() == 1
    before = _figure_state(batch)
    assert before is not None and before["svgs"] >= 1, before

    # MemoryView: the block pool is a heatmap, drawn by plotly as an <image> in the SVG.
    memory.locator(".js-plotly-plot .heatmaplayer image").first.wait_for(
        state="attached", timeout=UPDATE_TIMEOUT_MS
    )
    assert memory.get_by_role("button", name="Step").count() == 1
    memory_title_before = _figure_state(memory)["title"]
    assert "paged pool" in memory.locator(".js-plotly-plot").inner_text()

    # Step a few times: each click runs engine.step() in the kernel; the figure follows.
    bars = [before["bars"]]
    for n in range(1, NUM_STEPS + 1):
        step_button.click()
        _wait_for_title(page, batch, f"Continuous batching: {n} steps")
        batch.get_by_text(f"{n} steps · running").wait_for(timeout=UPDATE_TIMEOUT_MS)
        with contextlib.suppress(PlaywrightTimeoutError):  # the assert below says what is wrong
            page.wait_for_function(
                "([output, n]) => output.querySelectorAll("
                "'.js-plotly-plot .barlayer .point').length > n",
                arg=[batch.element_handle(), bars[-1]],
                timeout=UPDATE_TIMEOUT_MS,
            )
        bars.append(_figure_state(batch)["bars"])
    assert all(a < b for a, b in itertools.pairwise(bars)), f"bars per step did not grow: {bars}"

    # The MemoryView follows the same engine (its step callback), without its own clicks; a
    # redraw its throttle skipped comes shortly after the last step (the kernel's event loop).
    _wait_for_title_without(page, memory, "no running request")
    memory.get_by_text(f"{NUM_STEPS} steps · running").wait_for(timeout=UPDATE_TIMEOUT_MS)
    memory_title_after = _figure_state(memory)["title"]
    assert memory_title_after != memory_title_before, memory_title_after
    pool_text = memory.locator(".js-plotly-plot").inner_text()
    assert "paged pool:" in pool_text and "paged pool: 0 used" not in pool_text, pool_text

    _check_dashboard(page, outputs.nth(3))


def _check_dashboard(page, dashboard) -> None:
    """The ledger dashboard: three tabs, techniques ticked off and prices typed in redraw the
    pipeline figure and the books in the kernel."""
    dashboard.locator(".js-plotly-plot svg.main-svg").first.wait_for(
        state="attached", timeout=UPDATE_TIMEOUT_MS)
    for title in ("1 · pipeline", "2 · KV cache reuse", "3 · batching"):
        assert dashboard.get_by_role("tab", name=title).count() == 1, title
    from minilm_engine.course.viz.dashboard import LedgerDashboard

    # Every technique ticked: the last rung of the shipped ladder that was measured.
    _wait_for_title(page, dashboard, f"Optimization pipeline: {LedgerDashboard().selected.rung.name}")
    books = dashboard.locator(".ledger-books")
    books_before = books.text_content()
    # The HTML widget replaces its table on every update: read it afresh through the output.
    books_changed = """([output, before]) => {
        const books = output.querySelector('.ledger-books');
        return books !== null && books.textContent !== before;
    }"""
    assert "cost per Mtok output" in books_before and "noodle-chef" in books_before
    # Tick off the KV cache: the pipeline falls back to the first rung.
    dashboard.get_by_role("checkbox", name="KV cache", exact=True).uncheck()
    _wait_for_title(page, dashboard, "Optimization pipeline: no KV cache")
    page.wait_for_function(books_changed, arg=[dashboard.element_handle(), books_before],
                           timeout=UPDATE_TIMEOUT_MS)
    assert "no KV cache" in books.inner_text()
    # A new GPU price: the books follow.
    books_now = books.text_content()
    price = dashboard.locator(".widget-text", has_text="machine / h").locator("input")
    price.fill("7.5")
    price.press("Enter")
    page.wait_for_function(books_changed, arg=[dashboard.element_handle(), books_now],
                           timeout=UPDATE_TIMEOUT_MS)
    assert "$7.50/h" in dashboard.locator(".js-plotly-plot .gtitle").first.text_content()
    # Mode 3: its tab shows the live batch view of the dashboard's own engine.
    dashboard.get_by_role("tab", name="3 · batching").click()
    dashboard.get_by_role("button", name="Step").wait_for(timeout=UPDATE_TIMEOUT_MS)


if __name__ == "__main__":  # pragma: no cover - a quick manual run
    sys.exit(pytest.main([__file__, "-q", "-x", "-s"]))
