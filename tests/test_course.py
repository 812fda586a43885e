"""The course scaffolding: one repository path, install cells and badges in sync, the Colab
extra that upgrades nothing of Colab's, links between chapters that resolve."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import nbformat
import pytest

from minilm_engine.course.teaching import course

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))


def test_install_cells_and_badges_follow_the_one_constant() -> None:
    spec = importlib.util.spec_from_file_location("sync_notebooks", ROOT / "scripts" / "sync_notebooks.py")
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert not sync.synced(nb, path.relative_to(ROOT).as_posix()), (
            f"{path.name} is not in sync with course/teaching/course.py: run scripts/sync_notebooks.py"
        )
    for path in NOTEBOOKS:
        text = path.read_text()
        assert f"github/{course.REPOSITORY}/blob/main/notebooks/" in text
        assert "google.colab" not in text, f"{path.name}: detect Colab by COLAB_NOTEBOOK_ID"
        assert "[notebooks]" not in text, f"{path.name}: Colab must not get JupyterLab / ipywidgets 8"


def test_the_pinned_ref_is_this_version_and_the_readme_names_the_repository() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == course.PACKAGE_VERSION and course.GIT_REF == f"v{project['version']}"
    readme = (ROOT / "README.md").read_text()
    assert course.REPOSITORY in readme and "course/teaching/course.py" in readme


def test_the_colab_extra_forces_no_widget_or_frontend_upgrade() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    colab = " ".join(extras["colab"]).lower()
    assert "ipywidgets" not in colab and "jupyterlab" not in colab and "notebook" not in colab
    for requirement in extras["colab"]:  # Colab's versions satisfy every lower bound
        if requirement.startswith("minilm-engine["):
            continue  # another extra of ours (serve: fastapi, uvicorn, ...), none of Colab's frontend
        name, _, bound = requirement.partition(">=")
        pinned = {"plotly": "5.24.1", "anywidget": "0.9.13", "matplotlib": "3.10.0", "pandas": "2.2.2", "scipy": "1.14.1"}
        assert tuple(map(int, bound.split("."))) <= tuple(map(int, pinned[name].split("."))), requirement
    dependencies = " ".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    assert "ipywidgets" not in dependencies


LINK = re.compile(r"\]\(((?:\.\./)?[\w./-]+\.(?:ipynb|md))(#[\w-]+)?\)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_links_between_notebooks_resolve(path: Path) -> None:
    """Every relative link to a notebook or a Markdown file points at a file that exists, except
    links to planned chapters, which must say so."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for target, _anchor in LINK.findall(cell.source):
            if target.startswith("http"):
                continue
            resolved = (path.parent / target).resolve()
            assert resolved.exists(), f"{path.name}: link to {target} does not resolve"
