"""The package's import graph, read from the source with `ast` (nothing is imported).

Contract checked, over every module of the package (top-level modules and `__init__`s too, and
imports inside functions and `TYPE_CHECKING` blocks):

- the engine never imports the course: no module outside `course/` imports `minilm_engine.course`;
- no two parts import each other, directly or through others, where a part is a top-level folder
  (`core/`, `worker/`, `model/`, `entrypoints/`, `distributed/`, `bench/`, `course/`) or a
  top-level module (`pluggable`); the package's `__init__` (the public names) sits above all;
- the engine's layers point one way: `entrypoints/` -> `worker/` -> `core/` -> `model/`.

The layering in ARCHITECTURE.md is this graph, rendered by `layering()`:

    python tests/test_import_graph.py     # prints the block ARCHITECTURE.md must hold
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "minilm_engine"
ENGINE_ORDER = ("entrypoints", "worker", "core", "model")  # each may import only those after it


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> set[str]:
    return {module_name(p) for p in PACKAGE.rglob("*.py")}


def imported_modules(path: Path, modules: set[str]) -> set[str]:
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
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {module_name(p): imported_modules(p, modules) for p in PACKAGE.rglob("*.py")}


def part(module: str) -> str:
    """The top-level folder or module a module belongs to ("minilm_engine" for the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_the_graph_is_read():
    graph = import_graph()
    # A few edges we know are there: the reader must see them, or the tests below prove nothing.
    assert "minilm_engine.model.attention.paged" in graph["minilm_engine.model.attention.backends"]
    assert "minilm_engine.core.kv_cache_manager" in graph["minilm_engine.core.scheduler"]
    assert "minilm_engine.entrypoints.llm" in graph["minilm_engine"]  # top-level modules count
    assert "minilm_engine.pluggable" in graph["minilm_engine.core.block_pool"]


def test_nothing_outside_the_course_imports_it():
    graph = import_graph()
    assert sum(part(m) == "course" for m in graph) > 40  # the course is walked too
    for module, targets in graph.items():
        if part(module) == "course":
            continue
        reached = sorted(t for t in targets if part(t) == "course")
        assert not reached, f"{module} imports the course: {reached}"


def part_edges() -> dict[str, set[str]]:
    """part -> the other parts its modules import (the root's re-exports left out)."""
    edges: dict[str, set[str]] = {}
    for m, targets in import_graph().items():
        if m == "minilm_engine":
            continue
        edges.setdefault(part(m), set())
        edges[part(m)] |= {part(n) for n in targets if part(n) not in (part(m), "minilm_engine")}
    return edges


def cycle_in(edges: dict[str, set[str]]) -> list[str] | None:
    """A circle of parts importing each other, or None (depth-first search)."""
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


def test_no_two_parts_import_each_other():
    edges = part_edges()
    assert set(ENGINE_ORDER) | {"course", "bench", "distributed", "pluggable"} <= set(edges)
    cycle = cycle_in(edges)
    assert cycle is None, "parts in an import circle: " + " -> ".join(cycle)
    # the checker sees a circle when there is one
    assert cycle_in({**edges, "model": edges["model"] | {"entrypoints"}}) is not None


def test_the_engine_reads_in_the_order_a_step_runs():
    edges = part_edges()
    for i, upper in enumerate(ENGINE_ORDER):
        for lower in ENGINE_ORDER[:i]:
            assert lower not in edges[upper], f"{upper}/ imports {lower}/, which runs above it"


def test_the_root_has_at_most_three_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 3, top


def layering(edges: dict[str, set[str]]) -> str:
    """Parts from the top (imported by none) down, each with the parts it imports."""
    depth: dict[str, int] = {}

    def height(node: str) -> int:  # 0: imports no other part
        if node not in depth:
            depth[node] = 1 + max((height(n) for n in edges.get(node, ())), default=-1)
        return depth[node]

    def label(p: str) -> str:
        return p + ("/" if (PACKAGE / p).is_dir() else ".py")

    rows = sorted(edges, key=lambda f: (-height(f), f))
    width = max(len(label(f)) for f in rows) + 1
    return "\n".join(
        f"{label(f):<{width}} ──> "
        + (", ".join(label(n) for n in sorted(edges[f], key=lambda n: (-height(n), n))) or "(none)")
        for f in rows
    )


def test_architecture_shows_the_layering_as_it_is():
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    block = text.split("<!-- layering: python tests/test_import_graph.py -->\n```\n", 1)[1].split("```", 1)[0]
    assert block.strip() == layering(part_edges()), "regenerate with: python tests/test_import_graph.py"


if __name__ == "__main__":
    print(layering(part_edges()))
