#!/usr/bin/env bash
# CI: a second virtual environment pinned to what Google Colab ships (googlecolab/backend-info,
# pip freeze of 2026-08): ipywidgets 7.7.1, plotly 5.24.1, anywidget 0.9.x, the classic
# notebook 6.5, Triton 3.6 (appendix A1 runs its kernels in Triton's CPU interpreter), numpy 2.0.2
# (Triton 3.6's interpreter fails on numpy 2.4, which Colab does not ship).  Into it goes the package the way a chapter's first cell installs it on Colab
# (`minilm-engine[colab]`, which must not upgrade any of those), and what executing notebooks
# needs (pytest, nbclient, ipykernel).  torch is the CPU wheel of the version the main venv uses,
# from PyTorch's CPU index with --no-deps first, as dev.py and .ci/clients_env.sh do (Colab's is
# 2.11 with CUDA; the default index's Linux wheel would pull several GB of CUDA libraries).  The
# package is installed from a copy of its source (pyproject.toml, README.md, minilm_engine/), as
# Colab's install cell installs it from a fresh clone: so it does not build in this tree
# (minilm_engine.egg-info, build/) while .ci/run has dev.py install the main venv from it.
# --no-compile: bytecode is written on first import, for what is imported only.
#
#     bash .ci/colab_env.sh [VENV_DIR]      (default .venv-colab; reused when it is complete)
#
# Then .ci/run executes every notebook in it with COLAB_NOTEBOOK_ID set (tests/test_notebooks.py).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-colab}"
COLAB_PINS=(ipywidgets==7.7.1 plotly==5.24.1 "anywidget>=0.9,<0.10" "notebook>=6.5,<6.6" triton==3.6.0 numpy==2.0.2)
STAMP="$VENV/.colab-stamp"
WANTED="$(cat pyproject.toml .ci/colab_env.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANTED" ]; then
    echo "colab_env: $VENV is up to date"
    exit 0
fi
python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-compile)
TORCH="torch==${MINILM_COLAB_TORCH:-2.13.0}"
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    # torch's own dependencies (sympy, networkx, jinja2, filelock, fsspec) come with the pins.
    "${PIP[@]}" --no-deps --retries 2 --index-url https://download.pytorch.org/whl/cpu "$TORCH"
fi
SOURCE=$(mktemp -d "${TMPDIR:-/tmp}/minilm-colab-source.XXXXXX")
trap 'rm -rf "$SOURCE"' EXIT
cp -R pyproject.toml README.md minilm_engine "$SOURCE"/
find "$SOURCE" -name __pycache__ -prune -exec rm -rf {} +
# The pins first and together with the package (and torch), so pip fails loudly if the package's
# colab extra asked for anything newer (a forced ipywidgets 8 would break Colab's widgets).
"${PIP[@]}" "$TORCH" "${COLAB_PINS[@]}" "$SOURCE[colab]" pytest nbclient nbformat ipykernel hypothesis
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md

import anywidget, ipywidgets, notebook, plotly
versions = {"ipywidgets": ipywidgets.__version__, "plotly": plotly.__version__,
            "anywidget": anywidget.__version__, "notebook": notebook.__version__, "torch": md.version("torch")}
print("colab_env:", versions)
assert versions["ipywidgets"] == "7.7.1" and versions["plotly"] == "5.24.1", versions
assert versions["anywidget"].startswith("0.9.") and versions["notebook"].startswith("6.5."), versions
assert "+cu" not in versions["torch"], f"a CUDA torch was installed: {versions['torch']}"
PY
echo "$WANTED" > "$STAMP"
