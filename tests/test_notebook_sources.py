"""Every piece of package source a committed notebook shows is the package's source today.

Chapters show the engine's real code with `show_source(obj)` (teaching/notebook.py), whose
output starts with a `# module.qualname` line.  A refactor that changes such a function leaves
the committed output showing code that no longer exists; this test finds those outputs (re-run
the notebook, or keep the function's text) and names a shown object that is gone.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted(path for path in (Path(__file__).resolve().parents[1] / "notebooks").rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in path.parts)


def shown_sources(path: Path) -> list[tuple[int, str, str]]:
    """(cell index, dotted name, the source as shown) for every show_source output."""
    found = []
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        for output in cell.get("outputs", []):
            text = "".join(output.get("data", {}).get("text/plain", ""))
            if text.startswith("# minilm_engine."):
                header, _, source = text.partition("\n")
                found.append((index, header[2:], source))
    return found


def resolve(dotted: str):
    """The object `module.qualname` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            obj = getattr(obj, name, None)
            if obj is None:
                return None
        return obj.fget if isinstance(obj, property) else obj
    return None


def test_the_parser_finds_what_show_source_writes() -> None:
    from minilm_engine.core.kv_cache_utils import slot_mapping
    from minilm_engine.course.teaching.notebook import show_source

    shown = show_source(slot_mapping).data  # what the output's text/plain holds
    header, _, source = shown.partition("\n")
    assert resolve(header[2:]) is slot_mapping and source == inspect.getsource(slot_mapping)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_shown_source_is_current(path: Path) -> None:
    problems = []
    for index, dotted, shown in shown_sources(path):
        obj = resolve(dotted)
        if obj is None:
            problems.append(f"cell {index}: {dotted} no longer exists")
            continue
        current = inspect.getsource(obj)
        # show_source(obj, lines=(a, b)) shows a slice of the lines: it must still be one.
        if shown.strip() not in current:
            problems.append(f"cell {index}: {dotted} has changed since the notebook was run")
    assert not problems, f"{path.name}: re-run it (or keep the function's text): " + "; ".join(problems)
