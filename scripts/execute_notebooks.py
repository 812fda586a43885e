"""Execute the notebooks and keep their outputs, so that they read on GitHub without running.

    python scripts/execute_notebooks.py                    # every chapter and solution notebook
    python scripts/execute_notebooks.py notebooks/02_kv_cache.ipynb ...
    python scripts/execute_notebooks.py --smoke            # CI sizes (quick; for a dry run)

Each notebook runs top to bottom on the CPU (MINILM_DEVICE=cpu) at full size with static
figures (MINILM_STATIC_FIGURES=1: PNG images, which GitHub renders; plotly's JavaScript it does
not), from a copy stripped of old outputs, and is written back in place only if it executed
without an error.  "Full size" is each chapter's own `env.size(full=...)`: chosen to take a few
minutes on a laptop CPU.  tests/test_notebooks.py fails when a committed notebook lacks them.

A full run also renews the chapter's record of seed-claim verdicts (`notebooks/claims/NN.json`,
written by `teaching.claims.record`): the old record is set aside before the run, so that a claim
the chapter no longer judges (or now words differently) does not linger in chapter 09's table,
and put back if the run fails, as the notebook is.  tests/test_notebook_claims.py checks that
every record is printed by its chapter's committed outputs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def all_notebooks() -> list[Path]:
    notebooks = ROOT / "notebooks"
    return sorted(notebooks.glob("*.ipynb")) + sorted((notebooks / "solutions").glob("*.ipynb"))


def claims_record(path: Path) -> Path | None:
    """The verdicts file a chapter's `record(..., "NN")` calls write (NN: the name's prefix);
    None for a solution notebook, which records nothing."""
    if path.parent.name != "notebooks":
        return None
    return ROOT / "notebooks" / "claims" / f"{path.name.split('_')[0]}.json"


def execute(path: Path, smoke: bool, timeout_s: int) -> float:
    """Run one notebook; a full run starts its chapter's claims record afresh (see above)."""
    record = claims_record(path)
    if smoke or record is None or not record.exists():
        return _execute(path, smoke, timeout_s)
    set_aside = record.with_name(record.name + ".previous")
    record.replace(set_aside)
    try:
        seconds = _execute(path, smoke, timeout_s)
    except BaseException:
        set_aside.replace(record)
        raise
    set_aside.unlink()
    return seconds


def _execute(path: Path, smoke: bool, timeout_s: int) -> float:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    os.environ.update(MINILM_STATIC_FIGURES="1", MINILM_DEVICE="cpu", MINILM_SMOKE="1" if smoke else "0",
                      TQDM_DISABLE="1", HF_HUB_DISABLE_PROGRESS_BARS="1")  # progress bars are widgets in a
    # kernel, nothing to read later (transformers uses huggingface_hub's bars)
    os.environ.pop("COLAB_NOTEBOOK_ID", None)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    nb.metadata.pop("widgets", None)  # widget state is meaningless without a kernel
    nbformat.write(nb, path)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--smoke", action="store_true", help="CI sizes instead of full size")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = parser.parse_args()
    failed = []

    def name(path: Path) -> str:
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)

    for path in [p.resolve() for p in args.paths] or all_notebooks():
        try:
            seconds = execute(path, args.smoke, args.timeout)
            print(f"{name(path)}: executed in {seconds:.0f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - report every notebook, then fail
            failed.append(path)
            print(f"{name(path)}: FAILED ({type(e).__name__}: {str(e)[:500]})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
