"""The float32 reference: a SavedModel signature run in TensorFlow (conversion side only)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pe_export.errors import BadInputError, one_line
from pe_export.native import import_tensorflow
from pe_export.runners.base import Runner
from pe_export.savedmodel import LoadedSavedModel, load_savedmodel, signature_input_specs
from pe_export.specs import TensorSpec


class SavedModelRunner(Runner):
    """Not registered for files: it runs directories, and only where TensorFlow is installed."""

    name = "tensorflow"
    file_suffixes = ()

    def __init__(
        self, *args: Any, signature: str | None = None, loaded: LoadedSavedModel | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.signature_name = signature
        self._loaded = loaded
        self._signature: Any = None

    def activate(self) -> None:
        if self._loaded is None:
            self._loaded = load_savedmodel(self.model_path)
        self._signature = self._loaded.signature(self.signature_name)

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tf = import_tensorflow()
        try:
            outputs = self._signature(**{name: tf.constant(value) for name, value in feed.items()})
        except tf.errors.InvalidArgumentError as err:  # ids past a table, a length past the position table
            shapes = ", ".join(f"{name} {value.dtype}{list(value.shape)}" for name, value in feed.items())
            first = one_line(err)
            raise BadInputError(f"the SavedModel rejects the inputs ({shapes}): {first}") from err
        return {name: value.numpy() for name, value in outputs.items()}

    def input_specs(self) -> list[TensorSpec]:
        return signature_input_specs(self._signature)

    def output_names(self) -> list[str]:
        return sorted(self._signature.structured_outputs)

    def deactivate(self) -> None:
        self._signature = None
