"""The package's import graph, read from the code (imports inside functions included): no cycle between modules,
and none between the rooms (each subpackage as one, each top-level module as one), so that nothing imports upward
into what imports it. Imports under ``if TYPE_CHECKING:`` are left out: they never run."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import REPO

PACKAGE = "pe_export"
# the package's folders: setuptools' package-dir puts the pe_export/converters/ folder at pe_export.converters
FOLDERS = {PACKAGE: REPO / "pe_export", f"{PACKAGE}.targets": REPO / "targets"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            yield from (n for child in node.orelse for n in _imports_of(child))
            continue
        yield from _imports_of(node)


def _imports_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    else:
        yield from _imports(node)


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of the package's own modules."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            graph[name] |= {target for target in targets if target in known and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def room(module: str) -> str:
    """A subpackage is one room; a top-level module is a room of its own."""
    parts = module.split(".")
    return ".".join(parts[:2])


def rooms(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    collapsed: dict[str, set[str]] = {}
    for name, targets in graph.items():
        collapsed.setdefault(room(name), set()).update(room(t) for t in targets if room(t) != room(name))
    return collapsed


def test_the_graph_reader_sees_what_the_code_imports() -> None:
    graph = import_graph()
    assert len(graph) > 100
    # a top-level import, an in-function one, and one through the converters folder's package-dir
    assert "pe_export.errors" in graph["pe_export.api"]
    assert "pe_export.converters.tflite.convert" in graph["pe_export.api"]  # imported inside _export_tflite
    assert "pe_export.precisions" in graph["pe_export.converters.options"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles (break each by moving the shared part down): " + "; ".join(
        " <-> ".join(cycle) for cycle in found
    )


def test_no_room_imports_upward_into_one_that_imports_it() -> None:
    found = cycles(rooms(import_graph()))
    assert not found, "rooms that import each other (a subpackage reaching up into a module that uses it): " + (
        "; ".join(" <-> ".join(cycle) for cycle in found)
    )
