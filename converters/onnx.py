"""SavedModel → .onnx bytes with tf2onnx (plus our handlers), validated and optionally quantized.

A model past protobuf's 2 GiB cannot be serialized to bytes (XLM-R-large: 2.2 GB of float32 weights): it is
handed on as the ModelProto, and written with its weights as external data beside the file (``write_onnx``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pe_export.converters.keep_float import JudgeFeeds
from pe_export.converters.onnx_fusions import fuse_for_runtime
from pe_export.converters.onnx_rewrites import float16_stored, fold_shapes_of_initializers, rebuild_tables_at_load
from pe_export.converters.onnx_weight_int8 import weight_only_int8
from pe_export.converters.onnx_weights import bind_initializers, stand_in_names
from pe_export.converters.options import ExportOptions
from pe_export.converters.tf2onnx_fixes import sound_optimizers
from pe_export.converters.tf2onnx_order import repeatable_conversion
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

        from pe_export.converters import tf2onnx_handlers  # noqa: F401  (registers handlers)
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
    judge: JudgeFeeds | None = None,
    float_out: list[bytes] | None = None,
    searches: list[dict[str, Any]] | None = None,
) -> tuple[Any, str, list[str]]:
    """Convert one signature at its input specs. Returns (serialized model, captured log, notes); a model
    past 2 GiB comes as the ModelProto instead of bytes (checked before its weights are bound, and loaded by
    onnxruntime only when it is verified: a session takes a file, not bytes, past 2 GiB).

    ``prepared`` is a rewritten graph (position tables rebuilt at run time) to convert instead.
    ``judge`` gives the inputs (and valid masks) that dynamic int8 must meet the export's tolerance on,
    against the float model; without it every quantizable node is quantized. ``float_out`` receives the float32
    model's bytes where another precision is asked (the layer map is proven on it: pe_export/layers).
    ``searches`` receives the record of each accuracy-driven search that ran (``KeepFloatOutcome.record``).
    """
    tf2onnx = _import_tf2onnx()
    if prepared is None:
        # The frozen graph rather than tf2onnx.from_function: that would turn captured constant
        # tensors (a position table held by a layer) into extra graph inputs.
        graph_def, inputs, outputs = frozen.graph()
    else:
        graph_def, inputs, outputs = prepared.graph_def("onnx"), prepared.inputs, prepared.outputs
    # Weight stand-ins enter tf2onnx as graph inputs and are bound as initializers after it (onnx_weights.py).
    weights = {f"{name}:0": name for name in stand_in_names(graph_def)}
    with capture_native_output(quiet) as log, repeatable_conversion(), sound_optimizers():
        try:
            model, _ = tf2onnx.convert.from_graph_def(
                graph_def,
                input_names=[*inputs, *weights],
                output_names=list(outputs),
                opset=options.opset,
                tensors_to_rename={**inputs, **outputs, **weights},
            )
        except Exception as err:  # tf2onnx raises many types; all mean the same to the user
            failure: Exception | None = err
        else:
            failure = None
    if failure is not None:
        first = one_line(failure)
        raise ConversionError(f"tf2onnx failed: {first}") from failure
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
    if float_out is not None and options.quantize != "none" and not large:
        float_out.append(model.SerializeToString())
    model = _quantized(model, options, judge, notes, searches if searches is not None else [])
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
    if options.quantize != "none" or rebuilt:
        check_onnx_model(model, f"{options.quantize} model" if options.quantize != "none" else "table rebuild")
    data = model.SerializeToString()
    check_onnxruntime_loads(data)
    return data, log.text, notes


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


def _quantized(
    model: Any, options: ExportOptions, judge: JudgeFeeds | None, notes: list[str], searches: list[dict[str, Any]]
) -> Any:
    if options.quantize == "weight-float16":
        return _float16_storage(model)
    if options.quantize == "float16":
        return _float16_arithmetic(model, options, judge, notes, searches)
    if options.quantize == "dynamic-int8":
        return _dynamic_int8(model, options, judge, notes, searches)
    if options.quantize == "int8":
        return _static_int8(model, options, judge, notes, searches)
    if options.quantize == "weight-int8":
        model, count, replaced = weight_only_int8(model)
        notes.append(
            f"weight-int8: {count} weights stored as int8 with block scales ({replaced:,} B of float32 "
            "replaced); onnxruntime dequantizes them when it loads the file, so compute, speed and "
            "memory after loading stay float32's"
        )
    return model


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


def _float16_storage(model: Any) -> Any:
    """weight-float16: every float32 weight (rank ≥ 2) is stored in float16 and cast back.

    This is what the TFLite converter's float16 mode does on a CPU too; compute stays float32, so every
    provider runs it at fp32 speed with half the weight bytes. ``--quantize float16`` computes in float16
    (``onnx_float16``).
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


def _dynamic_int8(
    model: Any, options: ExportOptions, judge: JudgeFeeds | None, notes: list[str], searches: list[dict[str, Any]]
) -> Any:
    try:
        from pe_export.converters.onnx_quantize import quantize_to_target
    except ImportError as err:
        raise missing_extra("onnxruntime", "convert") from err
    feeds, valid, sequence = judge() if judge is not None else ([], [], None)
    outcome = quantize_to_target(
        model,
        feeds,
        options.tolerance,
        valid,
        sequence,
        keep=options.keep_float,
        outliers_per_input=options.outliers,
        kernel=options.kernel,
    )
    if feeds:
        for step in [*outcome.before, outcome]:  # the weights kept float before the blocks were cut back
            notes.extend(step.notes("quantizable nodes"))
            searches.append(step.record("quantizable nodes"))
    return outcome.model


def _static_int8(
    model: Any, options: ExportOptions, judge: JudgeFeeds | None, notes: list[str], searches: list[dict[str, Any]]
) -> Any:
    try:
        from pe_export.converters.onnx_static_int8 import static_int8_to_target
    except ImportError as err:
        raise missing_extra("onnxruntime", "convert") from err
    feeds, valid, sequence = judge() if judge is not None else ([], [], None)
    if not feeds:
        raise BadInputError(
            "--quantize int8 for ONNX calibrates its activation ranges on inputs, and none were given: pass --text "
            "or --inputs"
        )
    outcome = static_int8_to_target(
        model, feeds, options.tolerance, valid, sequence, keep=options.keep_float, outliers_per_input=options.outliers
    )
    for earlier in outcome.before:  # the weights kept float16 before the activations were chosen
        notes.extend(earlier.notes("int8 weights"))
        searches.append(earlier.record("int8 weights"))
    notes.extend(outcome.notes("quantizable nodes"))
    searches.append(outcome.record("quantizable nodes"))
    return outcome.model


def _float16_arithmetic(
    model: Any, options: ExportOptions, judge: JudgeFeeds | None, notes: list[str], searches: list[dict[str, Any]]
) -> Any:
    try:
        from pe_export.converters.onnx_float16 import float16_to_target
    except ImportError as err:
        raise missing_extra("onnxruntime", "convert") from err
    feeds, valid, sequence = judge() if judge is not None else ([], [], None)  # api.py always gives float16 them
    model, said = float16_to_target(
        model, feeds, options.tolerance, valid, sequence, keep=options.keep_float, searches=searches
    )
    notes.extend(said)
    return model


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
