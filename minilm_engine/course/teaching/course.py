"""The course as a whole: where it lives, and what every chapter's first cell and badge say.

Contract: `REPOSITORY` (GitHub "owner/name") and `GIT_REF` (the release a notebook installs on
Colab: the tag of this package's version) are the only place the repository path is written.
`install_cell()` is the source of every chapter's first code cell and `colab_badge(path)` the
badge of a notebook; `scripts/sync_notebooks.py` writes both into every notebook, and
tests/test_course.py fails when a notebook disagrees, so changing the constants here and
running the script moves every link at once.

The install cell runs only in Colab (detected by $COLAB_NOTEBOOK_ID) and only when the package
is missing, and installs `minilm-engine[colab]`: no JupyterLab, no ipywidgets upgrade (Colab
supports only its own ipywidgets 7); the chapters then pick a live renderer Colab shows.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# No git remote was configured when the course was assembled; this is the path the README
# has always named.  Change it (and run scripts/sync_notebooks.py) if the repository moves.
REPOSITORY = "minilm-engine/minilm-engine"
PACKAGE_VERSION = "0.1.0"  # = pyproject.toml's version (a test checks)
GIT_REF = f"v{PACKAGE_VERSION}"  # the release tag a notebook of this version installs on Colab

INSTALL_MARKER = "# Colab: install the package only"


def install_cell() -> str:
    """The first code cell of every notebook."""
    return (
        "import importlib.util, os\n"
        'if "COLAB_NOTEBOOK_ID" in os.environ and importlib.util.find_spec("minilm_engine") is None:\n'
        f"    {INSTALL_MARKER} (Colab's ipywidgets 7, plotly and anywidget stay as they are)\n"
        f'    %pip install -q "minilm-engine[colab] @ git+https://github.com/{REPOSITORY}@{GIT_REF}"'
    )


def colab_badge(notebook_path: str) -> str:
    """Markdown of the "Open in Colab" badge of `notebook_path` (relative to the repository)."""
    url = f"https://colab.research.google.com/github/{REPOSITORY}/blob/main/{notebook_path}"
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"


def installed_version() -> str | None:
    try:
        return version("minilm-engine")
    except PackageNotFoundError:
        return None
