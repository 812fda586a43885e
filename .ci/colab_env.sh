#!/usr/bin/env bash
# CI: a second virtual environment pinned to what Google Colab ships (googlecolab/backend-info,
# pip freeze of 2026-08): ipywidgets 7.7.1, plotly 5.24.1, anywidget 0.9.x, the classic
# notebook 6.5, Triton 3.6 (appendix A1 runs its kernels in Triton's CPU interpreter), numpy 2.0.2
# (Triton 3.6's interpreter fails on numpy 2.4, which Colab does not ship).  Into it goes the package the way a chapter's first cell installs it on Colab
# (`minilm-engine[colab]`, which must not upgrade any of those), and what executing notebooks
# needs (pytest, nbclient, ipykernel).  torch is the CPU wheel of the default index (Colab's
# is 2.11 with CUDA; the CPU build of the version the main venv uses keeps the download small).
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
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
"${PIP[@]}" "torch==${MINILM_COLAB_TORCH:-2.13.0}"
# The pins first and together with the package, so pip fails loudly if the package's colab
# extra asked for anything newer (a forced ipywidgets 8 would break Colab's widgets).
"${PIP[@]}" "${COLAB_PINS[@]}" ".[colab]" pytest nbclient nbformat ipykernel hypothesis
"$VENV/bin/python" - <<'PY'
import anywidget, ipywidgets, notebook, plotly
versions = {"ipywidgets": ipywidgets.__version__, "plotly": plotly.__version__,
            "anywidget": anywidget.__version__, "notebook": notebook.__version__}
print("colab_env:", versions)
assert versions["ipywidgets"] == "7.7.1" and versions["plotly"] == "5.24.1", versions
assert versions["anywidget"].startswith("0.9.") and versions["notebook"].startswith("6.5."), versions
PY
echo "$WANTED" > "$STAMP"
