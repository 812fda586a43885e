"""Every chapter notebook executes top to bottom on a CPU, at smoke size (as CI runs them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


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
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path) -> None:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    # The kernel inherits this process's environment: small experiment sizes, static figures.
    os.environ["MINILM_SMOKE"] = "1"
    os.environ["MINILM_STATIC_FIGURES"] = "1"
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
    assert NOTEBOOKS, "notebooks/ holds no chapter"
    for path in NOTEBOOKS:
        number = path.stem.split("_")[0]
        assert number.isdigit() or number.startswith("A"), f"{path.name}: name it NN_topic.ipynb"
