"""What a newcomer reads first stays true: docs/layout.md names every module, and every path a comment or the
README cites exists (the import graph's checks: tests/test_imports.py)."""

from __future__ import annotations

import re

from tests.helpers import REPO


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
        for path in sorted(folder.rglob("*.py")):  # a module of a subpackage: named, or its stem is
            if path.name != "__init__.py" and path.stem.replace("_", " ") not in layout.replace("_", " "):
                missing.append(str(path.relative_to(REPO)))
        for sub in sorted(p for p in folder.iterdir() if (p / "__init__.py").exists()):
            if f"{sub.name}/" not in layout:
                missing.append(f"{sub.relative_to(REPO)}/")
    assert not missing, f"docs/layout.md does not mention: {', '.join(missing)}"


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
