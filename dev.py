#!/usr/bin/env python3
"""Set up what is missing, then run the main job or the tests.

    python3 dev.py lab     # JupyterLab on notebooks/, with the shipped offline model
    python3 dev.py test    # the whole test suite (what CI runs)
    python3 dev.py lint    # ruff check over the package, scripts, benchmarks and tests (CI runs it too)

Needs only Python >= 3.10 and a package registry.  Everything goes into `.venv/` beside this
file.  torch comes first, and as the CPU build when no NVIDIA GPU is visible (the CUDA build is
several GB); set MINILM_TORCH to another pip requirement (e.g. "torch==2.6.0") to override.
Re-running skips installing when pyproject.toml has not changed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".minilm-installed"
# The CPU build we test with; PyTorch's CPU index serves it without the CUDA libraries.
TORCH_CPU = os.environ.get("MINILM_TORCH", "torch==2.13.0")
TORCH_GPU = os.environ.get("MINILM_TORCH", "torch>=2.4")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def run(*cmd: str | Path, **kwargs) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kwargs)


def has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    return subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def venv_has(module: str) -> bool:
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(PYTHON), "-c", probe]).returncode == 0


def setup() -> None:
    if sys.version_info < (3, 10):
        sys.exit(f"minilm-engine needs Python >= 3.10; this is {sys.version.split()[0]}")
    if not PYTHON.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    # --no-compile: bytecode is written on first import, for what is imported only (most of what
    # torch and Jupyter ship is never imported here), which shortens the install.
    pip = [PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-compile"]
    if not venv_has("torch"):
        if has_nvidia_gpu():
            run(*pip, TORCH_GPU)
        else:
            # --no-deps: torch's own dependencies come from the default index in the next step.
            run(*pip, "--no-deps", "--retries", "2", "--index-url", TORCH_CPU_INDEX, TORCH_CPU)
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not STAMP.exists() or STAMP.read_text() != wanted:
        run(*pip, "-e", f"{ROOT}[dev]")
        STAMP.write_text(wanted)


def main() -> None:
    jobs = {"lab": "JupyterLab on notebooks/", "test": "the test suite (extra args go to pytest)",
            "lint": "ruff check (extra args go to ruff)"}
    if len(sys.argv) < 2 or sys.argv[1] not in jobs:
        print(__doc__)
        sys.exit(2)
    setup()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if sys.argv[1] == "lab":
        os.chdir(ROOT)
        extra = sys.argv[2:]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            extra.append("--allow-root")  # containers and cloud VMs often run as root
        os.execve(PYTHON, [str(PYTHON), "-m", "jupyter", "lab", "notebooks/", *extra], env)
    elif sys.argv[1] == "lint":
        targets = ["minilm_engine", "scripts", "benchmarks", "tests", "dev.py"]
        code = subprocess.run([str(PYTHON), "-m", "ruff", "check", *targets, *sys.argv[2:]], cwd=ROOT, env=env).returncode
        sys.exit(code)
    else:
        code = subprocess.run([str(PYTHON), "-m", "pytest", *sys.argv[2:]], cwd=ROOT, env=env).returncode
        sys.exit(code)


if __name__ == "__main__":
    main()
