"""Every package directory is installed: the package list in pyproject.toml is explicit."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import pyproject

REPO = Path(__file__).resolve().parents[1]


def test_every_package_is_listed() -> None:
    config = pyproject()["tool"]["setuptools"]
    listed = set(config["packages"])
    mapped = {name: REPO / folder for name, folder in config["package-dir"].items()}
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "pe_export").rglob("__init__.py")}
    for name, folder in mapped.items():
        found |= {".".join((name, *p.parent.relative_to(folder).parts)) for p in folder.rglob("__init__.py")}
    found = {name.rstrip(".") for name in found}
    assert found == listed
