"""Every notebook executes top to bottom on a CPU at smoke size (as CI runs them), from a copy
stripped of its outputs; and every committed notebook carries the outputs of a full run, with
figures as PNG, so that it reads on GitHub without running.

The Colab job of .ci/run runs this file's chapters again in a venv pinned to Colab's versions
with COLAB_NOTEBOOK_ID set, so the Colab code path (install cell, anywidget views) executes too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))
NOTEBOOKS = CHAPTERS + SOLUTIONS


def _id(path: Path) -> str:
    return path.stem


def run_notebook(nb, folder: Path) -> list[str]:
    """Execute `nb` in place up to its first failing cell; describe every error output it holds
    (the failing cell's, and any a cell tagged "raises-exception" was allowed to keep)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}})
    try:
        client.execute()
    except CellExecutionError:
        pass  # nbclient stops at the failing cell and has recorded its error output: read below
    return [
        f"cell {index} ({cell.source.strip().splitlines()[0][:80] if cell.source.strip() else 'empty'!r}): "
        f"{out.get('ename')}: {out.get('evalue')}"
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[_id(p) for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path) -> None:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # a stripped copy: what executes is the code, not the committed outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    # The kernel inherits this process's environment: small experiment sizes, static figures
    # (the Colab job of .ci/run sets MINILM_STATIC_FIGURES=0, to execute the live views).
    os.environ["MINILM_SMOKE"] = "1"
    os.environ.setdefault("MINILM_STATIC_FIGURES", "1")
    errors = run_notebook(nb, path.parent)
    assert not errors, f"{path.name} raised:\n" + "\n".join(errors)


@pytest.mark.notebook
def test_run_notebook_reports_a_failing_cell(tmp_path: Path) -> None:
    # The check above must be able to fail: a cell that raises comes back as an error, and the
    # cells after it do not run.
    import nbformat

    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("x = 1"),
            nbformat.v4.new_code_cell("raise ValueError('the sauce burned')"),
            nbformat.v4.new_code_cell("print('after')"),
        ]
    )
    errors = run_notebook(nb, tmp_path)
    assert len(errors) == 1 and "cell 1" in errors[0] and "ValueError: the sauce burned" in errors[0]
    assert nb.cells[2].get("outputs", []) == []


def test_every_chapter_has_a_notebook() -> None:
    assert CHAPTERS, "notebooks/ holds no chapter"
    for path in CHAPTERS:
        number = path.stem.split("_")[0]
        assert number.isdigit() or number.startswith("A"), f"{path.name}: name it NN_topic.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[_id(p) for p in NOTEBOOKS])
def test_committed_notebook_reads_without_running(path: Path) -> None:
    """Outputs of a full run are committed (scripts/execute_notebooks.py): every code cell was
    executed, in order, without an error, and figures are images GitHub shows (PNG), not
    plotly JavaScript that it does not run."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    missing = [i for i, c in enumerate(code) if c.get("execution_count") is None]
    assert not missing, (
        f"{path.name}: code cells {missing} have no outputs committed; "
        "run scripts/execute_notebooks.py on it"
    )
    counts = [c.execution_count for c in code]
    assert counts == sorted(counts), f"{path.name}: cells were run out of order"
    assert any(c.outputs for c in code), f"{path.name}: no output at all"
    for i, cell in enumerate(code):
        for out in cell.outputs:
            assert out.get("output_type") != "error", f"{path.name}: cell {i} failed when executed"
            data = out.get("data", {})
            if "application/vnd.plotly.v1+json" in data or "application/vnd.jupyter.widget-view+json" in data:
                assert "image/png" in data, (
                    f"{path.name}: cell {i} has a plotly/widget output without a PNG; execute with "
                    "MINILM_STATIC_FIGURES=1"
                )
