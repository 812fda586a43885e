"""Every chapter notebook executes top to bottom on a CPU, at smoke size (as CI runs them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    # The kernel inherits this process's environment: small experiment sizes, static figures.
    os.environ["MINILM_SMOKE"] = "1"
    os.environ["MINILM_STATIC_FIGURES"] = "1"
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors, errors


def test_every_chapter_has_a_notebook() -> None:
    assert NOTEBOOKS, "notebooks/ holds no chapter"
    for path in NOTEBOOKS:
        number = path.stem.split("_")[0]
        assert number.isdigit() or number.startswith("A"), f"{path.name}: name it NN_topic.ipynb"
