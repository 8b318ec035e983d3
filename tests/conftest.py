"""Shared fixtures: SavedModels built once per session from tests/fixtures/models.py."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")

from tests.fixtures.models import MODEL_CASES, export_case


@pytest.fixture(scope="session")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """saved_model(name) → path of that case's SavedModel, built on first use."""
    built: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("saved_models")

    def get(name: str) -> Path:
        if name not in built:
            from pe_export.native import import_tensorflow

            import_tensorflow()
            built[name] = export_case(MODEL_CASES[name], root)
        return built[name]

    return get
