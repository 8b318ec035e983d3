"""Reading exported files without running them: .tflite and .onnx need no TensorFlow."""

from __future__ import annotations

from pathlib import Path

from pe_export.errors import BadInputError
from pe_export.inspection.summary import ModelSummary


def inspect_path(path: Path, signature: str | None = None) -> ModelSummary:
    """Summarize a .tflite, .onnx or SavedModel directory. Files need no TensorFlow."""
    path = Path(path)
    if not path.exists():
        raise BadInputError(f"{path} does not exist; expected a .tflite file, a .onnx file or a SavedModel dir")
    if path.is_dir():
        from pe_export.inspection.savedmodel_info import summarize_savedmodel

        return summarize_savedmodel(path, signature)
    suffix = path.suffix.lower()
    if suffix == ".tflite":
        from pe_export.inspection.tflite_file import summarize_tflite

        return summarize_tflite(path)
    if suffix == ".onnx":
        from pe_export.inspection.onnx_file import summarize_onnx

        return summarize_onnx(path)
    raise BadInputError(f"{path} is neither .tflite nor .onnx nor a directory; expected one of those")
