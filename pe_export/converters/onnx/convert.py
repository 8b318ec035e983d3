"""SavedModel → .onnx bytes with tf2onnx (plus our handlers), validated and optionally quantized.

A model past protobuf's 2 GiB cannot be serialized to bytes (XLM-R-large: 2.2 GB of float32 weights): it is
handed on as the ModelProto, and written with its weights as external data beside the file (``write_onnx``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pe_export.converters.onnx.fusions import fuse_for_runtime
from pe_export.converters.onnx.rewrites import fold_shapes_of_initializers, rebuild_tables_at_load
from pe_export.converters.onnx.tf2onnx_fixes import sound_optimizers
from pe_export.converters.onnx.tf2onnx_order import repeatable_conversion
from pe_export.converters.onnx.weights import bind_initializers, stand_in_names
from pe_export.converters.options import ExportOptions
from pe_export.converters.search.keep_float import ChoiceSamples
from pe_export.errors import BadInputError, ConversionError, missing_extra, one_line
from pe_export.inspection.onnx_file import import_onnx, unknown_ops
from pe_export.memory import ONNX_BYTES_PER_MESSAGE
from pe_export.native import capture_native_output
from pe_export.savedmodel import FrozenSignature
from pe_export.tables.graph import RUN_TIME_ZERO
from pe_export.tables.pipeline import PreparedGraph


def _import_tf2onnx() -> Any:
    try:
        import tf2onnx

        from pe_export.converters.onnx import tf2onnx_handlers  # noqa: F401  (registers handlers)
    except ImportError as err:
        raise missing_extra("tf2onnx", "convert") from err
    return tf2onnx


INLINE_LIMIT = ONNX_BYTES_PER_MESSAGE  # the size checks' limit (pe_export/memory.py): one protobuf message


def is_inline(model: Any) -> bool:
    """Whether ``model`` fits in one protobuf message, weights included."""
    return model_bytes(model) <= INLINE_LIMIT


def model_bytes(model: Any) -> int:
    """``model``'s serialized size, counted part by part: protobuf's ByteSize itself fails past 2 GiB."""
    graph = model.graph
    parts = [*graph.initializer, *graph.node, *graph.input, *graph.output, *graph.value_info, *model.metadata_props]
    return sum(int(part.ByteSize()) for part in parts) + 2**16  # + names, opsets, framing


def convert_onnx(
    frozen: FrozenSignature,
    options: ExportOptions,
    *,
    quiet: bool = True,
    prepared: PreparedGraph | None = None,
    samples: ChoiceSamples | None = None,
    float_out: list[bytes] | None = None,
    searches: list[dict[str, Any]] | None = None,
) -> tuple[Any, str, list[str]]:
    """Convert one signature at its input specs. Returns (serialized model, captured log, notes); a model
    past 2 GiB comes as the ModelProto instead of bytes (checked before its weights are bound, and loaded by
    onnxruntime only when it is verified: a session takes a file, not bytes, past 2 GiB).

    ``prepared`` is a rewritten graph (position tables rebuilt at run time) to convert instead.
    ``samples`` are those the precision's choices are made on (pe_export/precisions.py: its step); without them
    dynamic int8 quantizes every quantizable node. ``float_out`` receives the float32
    model's bytes where another precision is asked (the layer map is proven on it: pe_export/parity/layers).
    ``searches`` receives the record of each accuracy-driven search that ran (``KeepFloatOutcome.record``).
    """
    tf2onnx = _import_tf2onnx()
    if prepared is None:
        # The frozen graph rather than tf2onnx.from_function: that would turn captured constant
        # tensors (a position table held by a layer) into extra graph inputs.
        graph_def, inputs, outputs = frozen.graph()
    else:
        graph_def, inputs, outputs = prepared.graph_def("onnx"), prepared.inputs, prepared.outputs
    # Weight stand-ins enter tf2onnx as graph inputs and are bound as initializers after it (onnx/weights.py).
    weights = {f"{name}:0": name for name in stand_in_names(graph_def)}
    model, log = _tf2onnx_model(tf2onnx, graph_def, inputs, outputs, weights, options.opset, quiet)
    imported = import_node_domains(model)
    large = frozen.weights.nbytes > INLINE_LIMIT
    if large:  # onnx.checker takes no ModelProto past 2 GiB: check the graph while the weights are inputs
        check_onnx_model(model, "tf2onnx output")
    bind_initializers(model, list(weights.values()), frozen.weights.value)
    notes = _cleaned_up(model, options.fuse)
    imported = sorted({*imported, *import_node_domains(model)})
    if imported:
        notes.append(f"tf2onnx wrote ops of {', '.join(imported)} without their opset import: imported")
    if not large:
        check_onnx_model(model, "tf2onnx output")
    precision = options.precision_spec("onnx")
    if float_out is not None and not precision.plain and not large:
        float_out.append(model.SerializeToString())
    step = precision.step_function()
    if step is not None:
        model = step(model, options, samples, notes, searches if searches is not None else [])
    tables = len(prepared.replacements) if prepared is not None else 0
    rebuilt = tables > 0 and rebuild_tables_at_load(model, RUN_TIME_ZERO) > 0
    if rebuilt:
        notes.append(
            f"{tables} table(s) stored compressed and rebuilt from constants only: onnxruntime "
            "folds the rebuild once when it creates the session (no per-call cost; with optimisations off it runs "
            "every call)"
        )
    if not is_inline(model):
        return model, log.text, notes
    if not precision.plain or rebuilt:
        check_onnx_model(model, "table rebuild" if precision.plain else f"{precision.name} model")
    data = model.SerializeToString()
    check_onnxruntime_loads(data)
    return data, log.text, notes


def _tf2onnx_model(
    tf2onnx: Any,
    graph_def: Any,
    inputs: dict[str, str],
    outputs: dict[str, str],
    weights: dict[str, str],
    opset: int,
    quiet: bool,
) -> tuple[Any, Any]:
    """tf2onnx's model of ``graph_def`` and its captured log; any failure of it is a ConversionError."""
    with capture_native_output(quiet) as log, repeatable_conversion(), sound_optimizers():
        try:
            model, _ = tf2onnx.convert.from_graph_def(
                graph_def,
                input_names=[*inputs, *weights],
                output_names=list(outputs),
                opset=opset,
                tensors_to_rename={**inputs, **outputs, **weights},
            )
        except Exception as err:  # tf2onnx raises many types; all mean the same to the user
            failure: Exception | None = err
        else:
            failure = None
    if failure is not None:
        first = one_line(failure)
        raise ConversionError(f"tf2onnx failed: {first}") from failure
    return model, log


def _cleaned_up(model: Any, fuse: bool) -> list[str]:
    """In place: what tf2onnx wrote out at length, written as what it computes (shapes of constants as constants;
    with ``fuse``, LayerNorms and Tensordots as single ops); the notes that say what changed."""
    notes = []
    folding = fold_shapes_of_initializers(model)
    if folding.bytes_dropped:
        notes.append(
            f"{folding.shapes_folded} Shape op(s) of constants folded; {folding.initializers_dropped} constant(s) "
            f"that tf2onnx kept only for their shape dropped ({folding.bytes_dropped:,} B)"
        )
    fused = fuse_for_runtime(model).note() if fuse else None
    if fused:
        notes.append(fused)
    return notes


def check_onnxruntime_loads(data: bytes) -> None:
    """The checker accepts models onnxruntime cannot build a session for; try it (when installed)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own exception types
        first = one_line(err)
        raise ConversionError(f"onnxruntime cannot load the exported model: {first}") from err


# Opset versions of the domains tf2onnx writes ops of beside the standard one (onnxruntime's contrib ops).
DOMAIN_OPSETS = {"com.microsoft": 1}


def import_node_domains(model: Any) -> list[str]:
    """In place: an opset import for each known domain a node uses but the model does not import (tf2onnx writes
    com.microsoft ops, e.g. for CLIP's quick GELU, without one, and onnx.checker refuses the file); the domains."""
    onnx = import_onnx()
    imported = {entry.domain for entry in model.opset_import}
    used = {node.domain for node in _all_nodes(model.graph) if node.domain and node.domain != "ai.onnx"}
    missing = sorted(domain for domain in used - imported if domain in DOMAIN_OPSETS)
    for domain in missing:
        model.opset_import.append(onnx.helper.make_opsetid(domain, DOMAIN_OPSETS[domain]))
    return missing


def _all_nodes(graph: Any) -> list[Any]:
    """The graph's nodes and those of its subgraphs (If and Loop bodies)."""
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for attribute in node.attribute:
            for subgraph in [attribute.g, *attribute.graphs] if attribute.type in (5, 10) else []:
                nodes.extend(_all_nodes(subgraph))
    return nodes


def check_onnx_model(model: Any, what: str) -> None:
    """onnx.checker with full shape inference; names the offending nodes when it fails."""
    onnx = import_onnx()
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as err:
        bad = unknown_ops(model)
        nodes = [n.name for n in model.graph.node if n.op_type in bad][:5]
        where = f"; ops not in ONNX: {', '.join(bad)} (nodes {', '.join(nodes)})" if bad else ""
        first = one_line(err)
        raise ConversionError(f"{what} fails onnx.checker: {first}{where}") from err


def write_onnx(model: Any, path: Path, data_name: str) -> None:
    """``model`` at ``path``, its initializers in ``data_name`` beside it (ONNX external data, one file, as
    onnxruntime loads it); the ModelProto is left without their bytes."""
    onnx = import_onnx()
    try:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data_name,
            size_threshold=1024,
        )
    except OSError as err:
        raise BadInputError(f"cannot write {path}: {err.strerror or err}") from err


def relocate_external_data(path: Path, data_name: str) -> None:
    """Point the model at ``path`` to its external data under ``data_name`` (after the data file is renamed)."""
    onnx = import_onnx()
    model = onnx.load(str(path), load_external_data=False)
    for initializer in model.graph.initializer:
        for entry in initializer.external_data:
            if entry.key == "location":
                entry.value = data_name
    path.write_bytes(model.SerializeToString())
