"""The package's import graph, read from the source with `ast` (nothing is imported).

Contract checked: the engine core (engine/, kv_cache/, attention/, models/, spec_decode/,
quantization/, and the top-level modules they use: request, sampler, ...) reaches none of
teaching/, experiments/, viz/, ledger/; and no two folders of the package import each other,
directly or through others, anywhere in a file (inside functions and `TYPE_CHECKING` blocks
too), so each folder can be read, and tested, below the ones that use it.  The folder layering
in ARCHITECTURE.md is this graph, rendered by `folder_layering()`:

    python tests/test_import_graph.py     # prints the block ARCHITECTURE.md must hold
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "minilm_engine"
CORE = ("engine", "kv_cache", "attention", "models", "spec_decode", "quantization")
CORE_MODULES = ("request", "sampler", "sampling_params", "outputs", "inputs", "detokenizer", "device")
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


def is_core(module: str) -> bool:
    return folder(module) in CORE or module.split(".")[-1] in CORE_MODULES and folder(module) is None


def test_engine_core_reaches_no_teaching_code():
    graph = import_graph()
    assert sum(map(is_core, graph)) > 40  # every core folder and module is walked from
    for start in (m for m in graph if is_core(m)):
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    assert folder(nxt) not in NOT_CORE, f"{start} reaches {nxt}"
                    seen.add(nxt)
                    todo.append(nxt)


def folder_edges() -> dict[str, set[str]]:
    """folder -> the other folders its modules import (top-level modules left out)."""
    edges: dict[str, set[str]] = {}
    for m, targets in import_graph().items():
        if folder(m) is None:
            continue
        edges.setdefault(folder(m), set())
        edges[folder(m)] |= {folder(n) for n in targets if folder(n) not in (None, folder(m))}
    return edges


def folder_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A circle of folders importing each other, or None (depth-first search)."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def folder_layering(edges: dict[str, set[str]]) -> str:
    """Folders from the top (imported by none) down, each with the folders it imports."""
    depth: dict[str, int] = {}

    def height(node: str) -> int:  # 0: imports no other folder
        if node not in depth:
            depth[node] = 1 + max((height(n) for n in edges.get(node, ())), default=-1)
        return depth[node]

    rows = sorted(edges, key=lambda f: (-height(f), f))
    width = max(len(f) for f in rows) + 1
    lines = [f"{f + '/':<{width}} ──> " + (", ".join(f"{n}/" for n in sorted(edges[f], key=lambda n: (-height(n), n))) or "(none)")
             for f in rows]
    return "\n".join(lines)


def test_no_two_folders_import_each_other():
    edges = folder_edges()
    assert {"engine", "spec_decode", "quantization", "entrypoints", "bench"} <= set(edges)
    assert "attention" in edges["kv_cache"]  # the cache hands its tensors to attention
    cycle = folder_cycle(edges)
    assert cycle is None, "folders in an import circle: " + " -> ".join(cycle)
    # the checker sees a circle when there is one
    assert folder_cycle({**edges, "attention": edges["attention"] | {"engine"}}) is not None


def test_architecture_shows_the_folder_layering_as_it_is():
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    block = text.split("<!-- folder-layering: python tests/test_import_graph.py -->\n```\n", 1)[1].split("```", 1)[0]
    assert block.strip() == folder_layering(folder_edges()), "regenerate with: python tests/test_import_graph.py"


if __name__ == "__main__":
    print(folder_layering(folder_edges()))
