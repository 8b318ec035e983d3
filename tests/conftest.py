"""Shared fixtures: SavedModels built once per session from tests/fixtures/models.py."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # the same kernels whichever test imports TensorFlow first

from tests.fixtures.models import MODEL_CASES, export_case


def _built_once(
    tmp_path_factory: pytest.TempPathFactory, folder: str, build: Callable[[Path, Any], Path]
) -> Callable[[Any], Path]:
    """get(key) → build(root, key), made on first use and kept for the session."""
    built: dict[Any, Path] = {}
    root = tmp_path_factory.mktemp(folder)

    def get(key: Any) -> Path:
        if key not in built:
            from pe_export.native import import_tensorflow

            import_tensorflow()
            built[key] = build(root, key)
        return built[key]

    return get


@pytest.fixture(scope="session")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """saved_model(name) → path of that case's SavedModel, built on first use."""
    return _built_once(tmp_path_factory, "saved_models", lambda root, name: export_case(MODEL_CASES[name], root))


@pytest.fixture(scope="session")
def family_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """family_model(name) → SavedModel of that keras-hub family (tests/fixtures/keras_hub_models.py)."""
    from tests.fixtures.keras_hub_models import FAMILIES, export_family

    return _built_once(tmp_path_factory, "keras_hub", lambda root, name: export_family(FAMILIES[name], root))


@pytest.fixture(scope="session")
def variant_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """variant_model(name, seq_len, **builder_options) → SavedModel of a pe_export.encoders.variants encoder."""

    def build(root: Path, key: tuple) -> Path:
        from pe_export.encoders import variants

        name, seq_len, options = key
        builder = variants.VARIANTS[name][0] if name in variants.VARIANTS else getattr(variants, name)
        path = root / f"{name}-{seq_len}-{abs(hash(key))}"
        builder(seq_len, **dict(options)).export(str(path), verbose=False)
        return path

    get = _built_once(tmp_path_factory, "variants", build)
    return lambda name, seq_len, **options: get((name, seq_len, tuple(sorted(options.items()))))


@pytest.fixture(scope="session")
def exported_file(saved_model, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """exported_file(model, target, quantize="none") → that export (unverified), made once per session.

    Tests read these files and write their variants elsewhere: they are shared.
    """
    made: dict[tuple[str, str, str], Path] = {}
    root = tmp_path_factory.mktemp("exports")

    def get(model: str, target: str, quantize: str = "none") -> Path:
        key = (model, target, quantize)
        if key not in made:
            from pe_export.api import export_onnx, export_tflite
            from pe_export.converters.options import ExportOptions

            export = export_tflite if target == "tflite" else export_onnx
            path = root / f"{model}-{quantize}" / f"m.{target}"
            path.parent.mkdir(exist_ok=True)
            export(saved_model(model), path, ExportOptions(quantize=quantize, verify=False))
            made[key] = path
        return made[key]

    return get


def pytest_configure(config: pytest.Config) -> None:
    from tests.docker_builds import start

    start(config)  # the device images build in the background while the suite runs (only where wanted)
    # whole files go to the workers in the order pytest_collection_modifyitems gives (the slow modules first);
    # xdist's own reorder (3.6+, on by default: files by test count) sent the one- and two-test MiniLM files last,
    # where one worker ran them alone for over a minute (--no-loadscope-reorder, set here, where the order is made)
    config.option.loadscopereorder = False


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests.docker_builds import stop

    stop(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Whole-module slow files first (minutes each: real weights, emulated arm64, fuzzing, images), the quick ones
    after: with two workers taking whole files in this order, the short files fill the end instead of one long
    file running alone there. Within a file the order is kept."""

    def module_is_slow(item: pytest.Item) -> bool:
        marks = getattr(item.module, "pytestmark", []) if hasattr(item, "module") else []
        marks = marks if isinstance(marks, list) else [marks]
        return any(mark.name == "slow" for mark in marks)

    items.sort(key=lambda item: not module_is_slow(item))  # stable: collection order within each group
