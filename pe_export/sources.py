"""What users hold → the SavedModel the exporters read: a SavedModel folder as it is; a Keras ``.keras``
file, or a checkpoint folder in the Hugging Face layout (``config.json`` + ``*.safetensors``) of an
architecture keras-hub loads, exported to a temporary SavedModel for the length of the command.

A model is named by the digest of what the user holds (the ``.keras`` file, the checkpoint's files), so a
golden bundle and an export made from the same ``.keras`` in two commands match, although each command
writes its own temporary SavedModel.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pe_export.errors import BadInputError, RuntimeUnavailableError, missing_extra, one_line

KERAS_HUB_PYTHON = (3, 11)  # keras-hub 0.32, what checkpoint folders load through, has no release for 3.10

KERAS_SUFFIX = ".keras"
CHECKPOINT_CONFIG = "config.json"
CHECKPOINT_WEIGHTS = "*.safetensors"


@dataclass
class ModelSource:
    given: Path  # what the user passed
    saved_model: Path  # the SavedModel folder to read (the given folder, or a temporary export)
    kind: str  # "savedmodel", "keras" or "checkpoint"

    @cached_property
    def digest(self) -> str:
        """Names the model in bundles and exported files; read only when asked (--list-tables never is)."""
        from pe_export.savedmodel import savedmodel_digest

        if self.kind == "keras":
            return _files_digest([self.given])
        if self.kind == "checkpoint":
            return _files_digest([self.given / CHECKPOINT_CONFIG, *sorted(self.given.glob(CHECKPOINT_WEIGHTS))])
        return savedmodel_digest(self.saved_model)

    @cached_property
    def weight_bytes(self) -> int:
        """Bytes of its variables, from saved_model.pb alone (``memory.saved_weight_bytes``), read once."""
        from pe_export.memory import saved_weight_bytes

        return saved_weight_bytes(self.saved_model)


def output_stem(path: Path) -> str:
    """The name a default output takes from what the user passed: folder name, or file name less .keras."""
    path = Path(path).resolve()
    return (path.stem if path.suffix == KERAS_SUFFIX else path.name) or "model"


@contextlib.contextmanager
def model_source(path: Path) -> Iterator[ModelSource]:
    """The SavedModel behind ``path``; a temporary one is removed when the block ends."""
    from pe_export.savedmodel import check_savedmodel_dir, is_savedmodel_dir

    path = Path(path)
    if path.is_file() and path.suffix == KERAS_SUFFIX:
        with _exported(path, "keras") as saved:
            yield ModelSource(path, saved, "keras")
        return
    if path.is_dir() and not is_savedmodel_dir(path) and _is_checkpoint(path):
        with _exported(path, "checkpoint") as saved:
            yield ModelSource(path, saved, "checkpoint")
        return
    check_savedmodel_dir(path)
    yield ModelSource(path, path, "savedmodel")


def _is_checkpoint(path: Path) -> bool:
    return (path / CHECKPOINT_CONFIG).is_file() and any(path.glob(CHECKPOINT_WEIGHTS))


@contextlib.contextmanager
def _exported(path: Path, kind: str) -> Iterator[Path]:
    from pe_export.native import import_tensorflow

    import_tensorflow()  # TensorFlow's logging set up first, as for every SavedModel
    model: Any = _load_keras(path) if kind == "keras" else _load_checkpoint(path)
    work = Path(tempfile.mkdtemp(prefix="pe-export-source-"))
    try:
        saved = work / "saved_model"
        try:
            model.export(str(saved), verbose=False)
        except Exception as err:  # Keras raises many types for a model it cannot trace
            raise BadInputError(
                f"{path}: Keras could not export it as a SavedModel: {one_line(err)}; export it "
                "yourself with model.export(folder) and pass the folder"
            ) from err
        yield saved
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _load_keras(path: Path) -> object:
    import keras

    with contextlib.suppress(ImportError):
        import keras_hub  # noqa: F401  (registers its layers and backbones, so their .keras files load)
    try:
        # safe_mode refuses the Lambda layers a .keras file can only restore by running pickled code.
        return keras.saving.load_model(str(path), compile=False, safe_mode=True)
    except Exception as err:  # unknown custom layers are a TypeError, damaged zips a ValueError, …
        raise BadInputError(
            f"{path}: Keras cannot load it ({one_line(err)}); a model with custom layers needs them registered "
            "(@keras.saving.register_keras_serializable) in code pe-export imports: export it yourself with "
            "model.export(folder) and pass the folder"
        ) from err


def _load_checkpoint(path: Path) -> object:
    try:
        import keras_hub
    except ImportError as err:
        if sys.version_info < KERAS_HUB_PYTHON:  # the extra cannot help here: no keras-hub 0.32 for this Python
            raise RuntimeUnavailableError(
                f"{path} is a checkpoint folder, which loads through keras-hub 0.32, and that needs Python "
                f"{'.'.join(map(str, KERAS_HUB_PYTHON))}+ (this is {sys.version_info[0]}.{sys.version_info[1]}); "
                "export the model to a SavedModel or .keras file on a newer Python and pass that"
            ) from err
        raise missing_extra("keras-hub", "hub") from err
    try:
        return keras_hub.models.Backbone.from_preset(str(path))
    except Exception as err:  # an architecture keras-hub has no converter for, a missing file, …
        raise BadInputError(
            f"{path}: keras-hub cannot load this checkpoint ({one_line(err)}); expected a folder with "
            f"{CHECKPOINT_CONFIG} and safetensors of an architecture keras-hub supports (BERT, RoBERTa, DistilBERT, "
            "…), or pass a SavedModel folder"
        ) from err


def _files_digest(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
