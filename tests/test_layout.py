"""What a newcomer reads first stays true: docs/layout.md names every module, and pe_export/ has no
import cycle (module-level imports only; imports inside functions and under TYPE_CHECKING are lazy)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import REPO

PACKAGE_ROOTS = {
    "pe_export": REPO / "pe_export",
    "pe_export.converters": REPO / "converters",
    "pe_export.targets": REPO / "targets",
}


def layout_section() -> str:
    return (REPO / "docs" / "layout.md").read_text()


def test_readme_layout_names_every_module() -> None:
    layout = layout_section()
    missing = []
    for path in sorted((REPO / "pe_export").glob("*.py")):
        if path.name != "__init__.py" and f"pe_export/{path.name}" not in layout:
            missing.append(f"pe_export/{path.name}")
    for folder in sorted(p for p in (REPO / "pe_export").iterdir() if (p / "__init__.py").exists()):
        if f"pe_export/{folder.name}/" not in layout:
            missing.append(f"pe_export/{folder.name}/")
        for path in sorted(folder.glob("*.py")):  # a module of a subpackage: named, or its stem is
            if path.name != "__init__.py" and path.stem.replace("_", " ") not in layout.replace("_", " "):
                missing.append(str(path.relative_to(REPO)))
    for path in sorted((REPO / "converters").glob("*.py")):
        if path.name != "__init__.py" and path.name not in layout:
            missing.append(f"converters/{path.name}")
    assert not missing, f"docs/layout.md does not mention: {', '.join(missing)}"


def _module_name(path: Path) -> str:
    for package, root in PACKAGE_ROOTS.items():
        if path.is_relative_to(root):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join([package, *parts])
    raise AssertionError(path)


def _eager_imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Modules imported when this one is: module-level imports, not under `if TYPE_CHECKING:`."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for child in [node] if isinstance(node, (ast.Import, ast.ImportFrom)) else []:
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            else:
                base = child.module or ""
                if child.level:
                    parent = module.split(".") if is_package else module.split(".")[:-1]
                    base = ".".join(parent[: len(parent) - child.level + 1] + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in child.names)
    return {name for name in found if name.startswith("pe_export")}


def test_pe_export_has_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for root in PACKAGE_ROOTS.values():
        for path in root.rglob("*.py"):
            module = _module_name(path)
            graph[module] = _eager_imports(ast.parse(path.read_text()), module, path.name == "__init__.py")
    for module in graph:  # a submodule importing its own package is how packages work, not a cycle
        graph[module] = {m for m in graph[module] if m in graph and m != module and not module.startswith(m + ".")}
    cycles, state = [], dict.fromkeys(graph, 0)

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state[target] == 1:
                cycles.append(" → ".join([*stack[stack.index(target) :], target]))
            elif state[target] == 0:
                visit(target, [*stack, target])
        state[module] = 2

    for module in sorted(graph):
        if state[module] == 0:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(cycles)


# A repository path as code comments, docstrings and the README cite it: pe_export/parity/bundle.py, targets/steps.sh
CITED_PATH = re.compile(r"(?<![\w./-])((?:pe_export|converters|tests|benchmarks|targets|docker)/[\w./-]*\w)")


def test_every_file_a_comment_or_the_readme_cites_exists() -> None:
    sources = [
        REPO / "README.md",
        *sorted(REPO.glob("docs/*.md")),
        *sorted(REPO.glob("examples/*/README.md")),
        *sorted(REPO.glob("*/**/*.py")),
        *sorted(REPO.glob("targets/**/*.sh")),
        *sorted(REPO.glob("docker/*")),
    ]
    missing = set()
    cited = 0
    for source in sources:
        if any(part in {"build", ".git", ".venv"} or part.endswith(".egg-info") for part in source.parts):
            continue
        for path in CITED_PATH.findall(source.read_text(errors="replace")):
            if "*" in path or "<" in path:
                continue
            cited += 1
            if not (REPO / path).exists():
                missing.add(f"{path} (cited in {source.relative_to(REPO)})")
    assert cited > 50  # the pattern really finds the citations
    assert not missing, "cited but not in the repository: " + "; ".join(sorted(missing))
