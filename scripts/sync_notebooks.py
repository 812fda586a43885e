"""Write the course's install cell and Colab badge into every notebook (see course/teaching/course.py).

    python scripts/sync_notebooks.py          # rewrite notebooks/*.ipynb and notebooks/solutions/
    python scripts/sync_notebooks.py --check  # exit 1 and name the notebooks that differ

The install cell's lines (the first code cell with a `%pip install`, else the first code cell) (up to the `%pip install` line) are replaced by
`install_cell()`; what follows them in that cell (the chapter's `setup()` call) stays.  The
first markdown cell's Colab badge is replaced by `colab_badge(path)`, or added under the title.
Outputs are left alone.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

from minilm_engine.course.teaching.course import colab_badge, install_cell

ROOT = Path(__file__).resolve().parent.parent
BADGE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)")


def notebook_paths() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))


def synced(nb, relative: str) -> bool:
    """Bring `nb` in line; return True if anything changed."""
    changed = False
    cells = [c for c in nb.cells if c.cell_type == "code"]
    code = next((c for c in cells if "%pip install" in c.source), cells[0])
    lines = code.source.splitlines()
    end = next((i for i, line in enumerate(lines) if "%pip install" in line), None)
    if end is not None and lines[0].startswith("import importlib.util"):
        rest = lines[end + 1 :]
    else:
        rest = lines
    source = "\n".join([install_cell(), *rest])
    if code.source != source:
        code.source, changed = source, True
    title = next(c for c in nb.cells if c.cell_type == "markdown")
    badge = colab_badge(relative)
    if BADGE.search(title.source):
        source = BADGE.sub(lambda _: badge, title.source, count=1)
    else:
        head, _, tail = title.source.partition("\n")
        source = f"{head}\n\n{badge}\n{tail}"
    if title.source != source:
        title.source, changed = source, True
    return changed


def main() -> int:
    check = "--check" in sys.argv
    stale = []
    for path in notebook_paths():
        nb = nbformat.read(path, as_version=4)
        if synced(nb, path.relative_to(ROOT).as_posix()):
            stale.append(path.relative_to(ROOT).as_posix())
            if not check:
                nbformat.write(nb, path)
    if check and stale:
        print("not in sync with minilm_engine/course/teaching/course.py:", *stale, sep="\n  ")
        return 1
    print(("stale: " if check else "updated: ") + (", ".join(stale) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
