"""The ONNX precisions' conversion steps: the float32 model from tf2onnx in, the asked precision out.

Each step is named by its entry in pe_export/precisions.py and takes the same arguments: the model, the export's
options, the samples its choices are made on (None where nothing is chosen), and the lists its notes and search
records go to.
"""

from __future__ import annotations

from typing import Any

from pe_export.converters.onnx.float16 import float16_to_target
from pe_export.converters.onnx.quantize import quantize_to_target
from pe_export.converters.onnx.rewrites import float16_stored
from pe_export.converters.onnx.static_int8 import static_int8_to_target
from pe_export.converters.onnx.weight_int8 import weight_only_int8
from pe_export.converters.options import ExportOptions
from pe_export.converters.search.keep_float import ChoiceSamples, KeepFloatOutcome
from pe_export.errors import BadInputError
from pe_export.inspection.onnx_file import import_onnx

Searches = list[dict[str, Any]]


def float16_storage(
    model: Any, options: ExportOptions, samples: ChoiceSamples | None, notes: list[str], searches: Searches
) -> Any:
    """weight-float16: every float32 weight (rank ≥ 2) is stored in float16 and cast back.

    This is what the TFLite converter's float16 mode does on a CPU too; compute stays float32, so every
    provider runs it at fp32 speed with half the weight bytes. ``--quantize float16`` computes in float16
    (``onnx.float16``).
    """
    onnx = import_onnx()

    graph = model.graph
    casts, kept = [], []
    for initializer in graph.initializer:
        stored = (
            float16_stored(initializer)
            if initializer.data_type == onnx.TensorProto.FLOAT and len(initializer.dims) >= 2
            else None
        )
        if stored is not None:
            kept.append(stored[0])
            casts.append(stored[1])
        else:
            kept.append(initializer)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = casts + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def dynamic_int8(
    model: Any, options: ExportOptions, samples: ChoiceSamples | None, notes: list[str], searches: Searches
) -> Any:
    """dynamic-int8: without samples (--no-verify) every quantizable node is quantized."""
    outcome = quantize_to_target(
        model,
        samples or ChoiceSamples([], options.tolerance),
        keep=options.keep_float,
        outliers_per_input=options.outliers,
        kernel=options.kernel,
    )
    if samples is not None and samples.feeds:  # the weights kept float before the blocks were cut back, first
        _said([(step, "quantizable nodes") for step in [*outcome.before, outcome]], notes, searches)
    return outcome.model


def static_int8(
    model: Any, options: ExportOptions, samples: ChoiceSamples | None, notes: list[str], searches: Searches
) -> Any:
    if samples is None or not samples.feeds:
        raise BadInputError(
            "--quantize int8 for ONNX calibrates its activation ranges on inputs, and none were given: pass --text "
            "or --inputs"
        )
    outcome = static_int8_to_target(model, samples, keep=options.keep_float, outliers_per_input=options.outliers)
    # the weights kept float16 before the activations were chosen, first
    _said([*((earlier, "int8 weights") for earlier in outcome.before), (outcome, "quantizable nodes")], notes, searches)
    return outcome.model


def float16_arithmetic(
    model: Any, options: ExportOptions, samples: ChoiceSamples | None, notes: list[str], searches: Searches
) -> Any:
    # the export always gives float16 its samples (it measures the graph's values on them), verified or not
    model, said = float16_to_target(
        model, samples or ChoiceSamples([], options.tolerance), keep=options.keep_float, searches=searches
    )
    notes.extend(said)
    return model


def weight_int8(
    model: Any, options: ExportOptions, samples: ChoiceSamples | None, notes: list[str], searches: Searches
) -> Any:
    model, count, replaced = weight_only_int8(model)
    notes.append(
        f"weight-int8: {count} weights stored as int8 with block scales ({replaced:,} B of float32 "
        "replaced); onnxruntime dequantizes them when it loads the file, so compute, speed and "
        "memory after loading stay float32's"
    )
    return model


def _said(outcomes: list[tuple[KeepFloatOutcome, str]], notes: list[str], searches: Searches) -> None:
    """Each search's notes and record, in the order they ran (``what`` names its candidates)."""
    for outcome, what in outcomes:
        notes.extend(outcome.notes(what))
        searches.append(outcome.record(what))
