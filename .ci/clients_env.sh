#!/usr/bin/env bash
# CI: a third virtual environment for clients of `minilm-engine serve` that this project did not
# write, which tests/test_real_clients.py drives as subprocesses: lm-evaluation-harness (its
# `local-completions`, `local-chat-completions` and `hf` backends), guidellm (its openai_http
# backend), and the agent frameworks' clients of structured outputs and tool calls (LangChain's
# `langchain-openai`, LiteLLM).  They pull many dependencies (datasets, evaluate, sacrebleu, pydantic, ...), so they
# live apart from the engine's venv and cannot change what the engine is tested with.  torch is
# the CPU wheel of the version the main venv uses, installed first from PyTorch's CPU index with
# --no-deps (as dev.py does), so lm-eval's `hf` backend does not pull the CUDA build;
# transformers is pinned to the main venv's, so `hf` reads the checkpoint as the engine's tests do.
# --no-compile: bytecode is written on first import, for what the clients import only (most of
# what these packages ship, the tests never import).  .ci/run builds this venv in the background
# while the main venv installs.
#
#     bash .ci/clients_env.sh [VENV_DIR]      (default .venv-clients; reused when it is complete)
#
# Then .ci/run runs the test suite with MINILM_REQUIRE_CLIENTS=1 (tests/test_real_clients.py finds
# the venv at .venv-clients, or MINILM_CLIENTS_PYTHON), so a missing client is a failure in CI,
# not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-clients}"
TORCH="torch==${MINILM_CLIENTS_TORCH:-2.13.0}"
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
CLIENT_PINS=("lm-eval[api,hf]==0.4.13" "guidellm==0.8.1" "transformers==5.24.0" "langchain-openai==1.8.1"
             "litellm==1.110.2")
STAMP="$VENV/.clients-stamp"
WANTED="$(cat .ci/clients_env.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANTED" ]; then
    echo "clients_env: $VENV is up to date"
    exit 0
fi
python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-compile)
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    # torch's own dependencies (sympy, networkx, jinja2, filelock, fsspec) come with the pins.
    "${PIP[@]}" --no-deps --retries 2 --index-url "$TORCH_CPU_INDEX" "$TORCH"
fi
# All pins in one resolve, with torch among them, so pip fails loudly rather than replace the
# CPU torch with a CUDA one or move transformers off the engine's version.
"${PIP[@]}" "$TORCH" "${CLIENT_PINS[@]}"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
versions = {name: md.version(name) for name in ("lm_eval", "guidellm", "transformers", "torch", "langchain-openai",
                                                "litellm")}
print("clients_env:", versions)
assert versions["lm_eval"] == "0.4.13" and versions["guidellm"] == "0.8.1", versions
assert "+cu" not in versions["torch"], f"a CUDA torch was installed: {versions['torch']}"
PY
echo "$WANTED" > "$STAMP"
