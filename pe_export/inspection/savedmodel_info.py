"""Summarize a SavedModel directory (TensorFlow side): signatures, frozen-graph ops, variables."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pe_export.inspection.summary import ConstantInfo, ModelSummary, RuntimeVerdict, SignatureInfo
from pe_export.savedmodel import (
    frozen_graph_def,
    load_savedmodel,
    signature_input_specs,
    signature_output_specs,
)

if TYPE_CHECKING:
    from pe_export.lengths import SequenceLimit
    from pe_export.savedmodel import LoadedSavedModel

_NON_COMPUTE_OPS = {"Placeholder", "Const", "Identity", "NoOp"}


def summarize_savedmodel(path: Path, signature: str | None = None) -> ModelSummary:
    loaded = load_savedmodel(path)
    signatures = [
        SignatureInfo(name, signature_input_specs(fn), signature_output_specs(fn))
        for name, fn in sorted(loaded.obj.signatures.items())
    ]
    chosen = loaded.signature(signature)
    graph = frozen_graph_def(chosen)
    op_counts = Counter(node.op for node in graph.node if node.op not in _NON_COMPUTE_OPS)
    constants = [
        ConstantInfo(
            variable.path if hasattr(variable, "path") else variable.name,
            variable.dtype.name,
            tuple(variable.shape.as_list()),
            int(variable.shape.num_elements() or 0) * variable.dtype.size,
        )
        for variable in getattr(loaded.obj, "variables", [])
    ]
    details = {"signature inspected": loaded.resolve_signature_name(signature)}
    limit = _sequence_limit(loaded, chosen)
    if limit is not None:
        details["longest sequence"] = limit.describe()
    file_bytes = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
    return ModelSummary(
        path=Path(path),
        format="savedmodel",
        file_bytes=file_bytes,
        signatures=signatures,
        op_counts=op_counts,
        constants=constants,
        runs_on=[RuntimeVerdict("tensorflow", True, "SavedModel; convert with `pe-export tflite|onnx`")],
        details=details,
    )


def _sequence_limit(loaded: LoadedSavedModel, signature: Any) -> SequenceLimit | None:
    """The longest sequence the signature takes, where a dynamic length meets a table read by position."""
    from pe_export.lengths import model_limit
    from pe_export.savedmodel import FrozenSignature

    return model_limit(loaded, FrozenSignature(signature, signature_input_specs(signature)))
