"""The package's import graph, read from the source with `ast` (nothing is imported).

Contract checked: the engine core (engine/, kv_cache/, attention/, models/) reaches none of
teaching/, experiments/, viz/, and its folders import each other without a circle, so each
can be read, and tested, below the ones that use it:

    engine ──> kv_cache ──> models ──> attention      (each may also skip a layer down)
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "minilm_engine"
CORE = ("engine", "kv_cache", "attention", "models")
NOT_CORE = ("teaching", "experiments", "viz", "ledger")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every minilm_engine module `path` imports, anywhere in the file (functions included)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb from this file's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            # `from . import x` / `from .pkg import mod` may name submodules
            found |= {f"{target}.{alias.name}" for alias in node.names}
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imported_modules(p) for p in PACKAGE.rglob("*.py")}


def folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else None


def test_the_graph_is_read():
    graph = import_graph()
    # A few edges we know are there: the reader must see them, or the tests below prove nothing.
    assert "minilm_engine.attention.paged" in graph["minilm_engine.attention.backends"]
    assert "minilm_engine.kv_cache.block_manager" in graph["minilm_engine.engine.scheduler"]
    assert "minilm_engine.attention.triton_paged_decode" in graph["minilm_engine.experiments.kernel_stats"]


def test_engine_core_reaches_no_teaching_code():
    graph = import_graph()
    for start in (m for m in graph if folder(m) in CORE):
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    assert folder(nxt) not in NOT_CORE, f"{start} reaches {nxt}"
                    seen.add(nxt)
                    todo.append(nxt)


def test_core_folders_import_downward_only():
    # Layered, lowest first: a folder imports only folders below it, so there is no circle.
    layers = ["attention", "models", "kv_cache", "engine"]
    edges = {
        (folder(m), folder(n))
        for m, targets in import_graph().items()
        for n in targets
        if folder(m) in CORE and folder(n) in CORE and folder(m) != folder(n)
    }
    assert ("kv_cache", "attention") in edges  # the cache hands its tensors to attention
    upward = sorted((a, b) for a, b in edges if layers.index(a) < layers.index(b))
    assert not upward, f"imports against the layering {layers}: {upward}"
