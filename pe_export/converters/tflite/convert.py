"""SavedModel → .tflite bytes with the TFLite converter: op sets, shapes, quantization."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import replace
from functools import cached_property, partial
from typing import Any

import numpy as np

from pe_export.converters.options import ExportOptions
from pe_export.converters.search.keep_float import ChoiceSamples
from pe_export.converters.tflite.flex_rewrites import (
    FLEX_EINSUM,
    FLEX_ROLL,
    einsums_as_matmul,
    int64_signs_by_comparison,
    rolls_as_gathers,
)
from pe_export.converters.tflite.graph_rewrites import (
    INT32_ONLY_OPS,
    SLICE_FLEX_OP,
    flat_lookups,
    int64_ops_through_int32,
    new_axis_slices_to_expand_dims,
    prefix_slices_to_slice,
    shrinking_slices_as_squeeze,
)
from pe_export.errors import ConversionError, NeedsFlexError
from pe_export.graphdef import concrete_from_graph_def
from pe_export.inspection.tflite_file import summarize_tflite_bytes
from pe_export.memory import release_freed_memory
from pe_export.native import capture_native_output, import_tensorflow
from pe_export.precisions import Precision
from pe_export.savedmodel import FrozenSignature, LoadedSavedModel
from pe_export.specs import TensorSpec
from pe_export.tables.pipeline import PreparedGraph

_ERROR_LINE = re.compile(r"error: (.+)")
_OPS_LINE = re.compile(r"(?:Custom|Flex) ops: (.+)")


def convert_tflite(
    loaded: LoadedSavedModel,
    frozen: FrozenSignature,
    options: ExportOptions,
    calibration: Callable[[], Iterator[dict[str, np.ndarray]]] | None = None,
    *,
    quiet: bool = True,
    prepared: PreparedGraph | None = None,
    samples: ChoiceSamples | None = None,
    preconverted: tuple[bytes | None, str, bytes | None] | None = None,
    float_out: list[bytes] | None = None,
    searches: list[dict[str, Any]] | None = None,
) -> tuple[bytes, str, list[str]]:
    """Convert one signature at the given input specs. Returns (flatbuffer, captured converter log, notes).

    ``preconverted`` is (flatbuffer, log, float32 flatbuffer or None) of the plain SavedModel conversion already
    made (pe_export/converters/tflite/child.py): it stands for the first conversion where that is the SavedModel as it
    is, and its float32 file for dynamic-int8's and full int8's (which has no flatbuffer of its own there).

    ``prepared`` is a rewritten graph (position tables rebuilt at run time) to convert instead.
    Where the converter needs a Flex op that builtins can do (FlexStridedSlice for axis-inserting
    slices, FlexAbs/FlexSign for int64 position arithmetic), the graph is rewritten and converted
    again; the notes say so. ``samples`` are those the precision's choices are made on (dynamic-range int8's
    weights kept float, full integer's int16 activations), against the float32 file; without them the
    converter's dynamic-range file is kept, and full integer's activations are every one int16.
    ``float_out`` receives the float32 file where one was made on the way (dynamic-int8's search): the layer
    map is proven on it (pe_export/parity/layers). ``searches`` receives the record of dynamic-int8's search
    (``KeepFloatOutcome.record``).
    """
    source, precision = _GraphSource(loaded, frozen, prepared), options.precision_spec("tflite")
    if precision.from_float_file:
        return _full_integer(source, options, calibration, quiet, float_out, samples, searches, preconverted)
    data, log, notes, graph = _convert_with_rewrites(source, options, calibration, quiet, preconverted)
    if precision.edits_converter_file and samples is not None:
        if samples.feeds:
            from pe_export.converters.tflite.dynamic_int8 import int8_to_target

            if preconverted is not None and data is preconverted[0] and preconverted[2] is not None:
                float_file = preconverted[2]  # the child's, of the same conversion
            else:
                float_file, _ = _convert(
                    source,
                    replace(options, quantize="none"),
                    None,
                    quiet=quiet,
                    allow_flex=not options.builtins_only,
                    graph=graph,
                )
            if float_out is not None:
                float_out.append(float_file)
            outcome = int8_to_target(data, float_file, samples, keep=options.keep_float)
            data = outcome.model
            for step in [*outcome.before, outcome]:  # the weights kept float before the groups were cut back
                notes = [*notes, *step.notes("int8 weights")]
                if searches is not None:
                    searches.append(step.record("int8 weights"))
    return data, log, notes


def _full_integer(
    source: _GraphSource,
    options: ExportOptions,
    calibration: Callable[[], Iterator[dict[str, np.ndarray]]] | None,
    quiet: bool,
    float_out: list[bytes] | None,
    samples: ChoiceSamples | None = None,
    searches: list[dict[str, Any]] | None = None,
    preconverted: tuple[bytes | None, str, bytes | None] | None = None,
) -> tuple[bytes, str, list[str]]:
    """--quantize int8: the float32 file (every rewrite of a plain export), made full-integer, its activations
    int8 or int16 by measured error (tflite_mixed); without judging inputs (--no-verify) every activation int16
    (tflite_integer). ``preconverted``'s float32 file (the child's) stands for the plain conversion where that is
    the SavedModel as it is."""
    from pe_export.converters.tflite.integer import full_integer

    if calibration is None:
        raise ValueError("int8 quantization needs calibration inputs")
    plain = replace(options, quantize="none")
    child = None if preconverted is None else (preconverted[2], preconverted[1], None)
    float_file, log, notes, _ = _convert_with_rewrites(source, plain, None, quiet, child, for_gpu=False)
    release_freed_memory()  # the converter's freed buffers, before calibration's copies of the model
    if float_out is not None:
        float_out.append(float_file)
    names = [spec.name for spec in source.frozen.specs]
    if samples is None:
        result = full_integer(float_file, calibration(), names)
        return result.model, log, [*notes, *result.notes(), "every activation int16: nothing judged (--no-verify)"]
    from pe_export.converters.tflite.mixed import mixed_integer, searched_record

    outcome = mixed_integer(
        float_file,
        calibration(),
        names,
        samples,
        keep_int16=options.keep_int16,
        keep_float=options.keep_float,
    )
    if searches is not None:
        searches.append(searched_record(outcome))
    return outcome.file.model, log, [*notes, *outcome.notes()]


def _convert_with_rewrites(
    source: _GraphSource,
    options: ExportOptions,
    calibration: Callable[[], Iterator[dict[str, np.ndarray]]] | None,
    quiet: bool,
    preconverted: tuple[bytes | None, str, bytes | None] | None = None,
    *,
    for_gpu: bool = True,
) -> tuple[bytes, str, list[str], Any | None]:
    """(flatbuffer, log, notes, the rewritten GraphDef converted or None for the source's own). ``for_gpu``: the
    fixed-shape rewrites for LiteRT's GPU accelerator apply (a full-integer file is for NPUs: its quantizer
    cannot take the flattened lookup's table)."""
    loaded = source.loaded
    convert = partial(_convert, source, options, calibration, quiet=quiet)
    fixed = for_gpu and all(None not in spec.shape for spec in source.frozen.specs)
    fast, fast_notes = _speed_rewrites(source.graph()[0], source.rebuilt_prefix_tables, fixed)
    try:
        if preconverted is not None and preconverted[0] is not None and fast is None and source.converts_saved_model:
            data, log = preconverted[0], preconverted[1]
        else:
            data, log = convert(allow_flex=not options.builtins_only, graph=fast)
        first_error: ConversionError | None = None
    except ConversionError as err:
        if not options.builtins_only:
            raise
        data, log, first_error = None, "", err
    flex = _flex_ops(data, convert, fast, loaded.path)
    if data is None or (flex is not None and flex & REWRITABLE_FLEX_OPS):
        graph, notes = _builtin_rewrites(source.graph()[0] if fast is None else fast, flex)
        if notes:
            try:
                retried, retried_log = convert(allow_flex=not options.builtins_only, graph=graph)
            except ConversionError:
                retried = None
            if retried is not None:
                left = set(summarize_tflite_bytes(retried, loaded.path).flex_ops)
                if data is None or len(left) < len(flex or ()):
                    return retried, retried_log, [*fast_notes, *notes], graph
    if data is not None:
        return data, log, fast_notes, fast
    assert first_error is not None
    # --builtins-only: say which ops would need Flex, from a conversion with select TF ops allowed.
    try:
        data, _ = convert(allow_flex=True)
    except ConversionError:
        raise first_error from None
    needed = summarize_tflite_bytes(data, loaded.path).flex_ops
    if not needed:
        raise first_error
    raise NeedsFlexError(
        f"--builtins-only: the model needs select TF (Flex) ops {', '.join(needed)}; drop --builtins-only "
        "to export with Flex (the device then needs a Flex-linked TFLite), or replace those ops"
    ) from None


REWRITABLE_FLEX_OPS = {SLICE_FLEX_OP, FLEX_EINSUM, FLEX_ROLL, *INT32_ONLY_OPS.values()}


def _speed_rewrites(graph_def: Any, rebuilt: Collection[str], fixed_shapes: bool) -> tuple[Any | None, list[str]]:
    """Rewrites for faster kernels: (the rewritten GraphDef, its notes), or (None, []) when none applies.
    ``fixed_shapes``: every input's shape is fixed, as LiteRT's GPU accelerator needs (its slices then drop no axis;
    a dynamic export keeps the converter's own SavedModel importer, which needs less memory). With both fixed-shape
    rewrites the demo encoder and all-MiniLM-L6-v2 run whole on the accelerator (no CPU fallback)."""
    notes = []
    graph_def, count = prefix_slices_to_slice(graph_def, rebuilt)
    if count:
        notes.append(
            f"{count} prefix slice(s) of a table (table[:, :T]) converted as SLICE: TFLite's STRIDED_SLICE "
            "kernel copies element by element (20x slower on a large table)"
        )
    if fixed_shapes:
        graph_def, squeezed = shrinking_slices_as_squeeze(graph_def)
        if squeezed:
            notes.append(
                f"{squeezed} slice(s) that drop an axis (x[:, 0]) keep it and squeeze it: LiteRT's GPU accelerator "
                "refuses a slice's shrink mask"
            )
        count += squeezed
        graph_def, flattened = flat_lookups(graph_def)
        if flattened:
            notes.append(
                f"{flattened} table lookup(s) read by flattened ids (1-D GATHER indices): LiteRT's GPU accelerator "
                "takes no other"
            )
        count += flattened
    return (graph_def, notes) if count else (None, [])


def _flex_ops(data: bytes | None, convert: Callable[..., tuple[bytes, str]], graph: Any, path: Any) -> set[str] | None:
    """The Flex ops the file needs; where --builtins-only refused it (``data`` None), those a conversion allowing
    them needs, which say which rewrites are called for; None where that fails too."""
    if data is None:
        try:
            data, _ = convert(allow_flex=True, graph=graph)
        except ConversionError:
            return None
    return set(summarize_tflite_bytes(data, path).flex_ops)


# Each rewrite that turns Flex ops into builtins, in turn: the Flex ops that call for it (empty: any), and the note
# it leaves ({count}: how many it changed). An einsum the converter lowers by itself is left to it.
_BUILTIN_REWRITES: list[tuple[Callable[[Any], tuple[Any, int]], set[str], str]] = [
    (
        new_axis_slices_to_expand_dims,
        set(),
        "{count} axis-inserting StridedSlice op(s) (x[:, None] and the like) converted as "
        f"ExpandDims: without it they needed {SLICE_FLEX_OP}",
    ),
    (
        int64_ops_through_int32,
        set(),
        "{count} int64 Abs/Sign op(s) of position arithmetic computed in int32 (the values are "
        f"bounded by the sequence length): without it they needed {', '.join(INT32_ONLY_OPS.values())}",
    ),
    (
        int64_signs_by_comparison,
        set(INT32_ONLY_OPS.values()),
        "{count} other int64 Abs/Sign op(s) computed by comparisons (exact for every value): without it "
        f"they needed {', '.join(INT32_ONLY_OPS.values())}",
    ),
    (
        einsums_as_matmul,
        {FLEX_EINSUM},
        f"{{count}} einsum(s) of one batched matrix product converted as BATCH_MATMUL: without it {FLEX_EINSUM}",
    ),
    (
        rolls_as_gathers,
        {FLEX_ROLL},
        f"{{count}} roll(s) by constant shifts converted as gathers of shifted positions: without it {FLEX_ROLL}",
    ),
]


def _builtin_rewrites(graph_def: Any, flex: set[str] | None) -> tuple[Any, list[str]]:
    """Every rewrite that turns a Flex op into builtins, applied in turn; (graph, one note per rewrite used).
    ``flex``: the Flex ops the plain conversion needed (None: it failed)."""
    notes = []
    for rewrite, called_for, note in _BUILTIN_REWRITES:
        if called_for and not (flex is None or called_for & flex):
            continue
        graph_def, count = rewrite(graph_def)
        if count:
            notes.append(note.format(count=count))
    return graph_def, notes


class _GraphSource:
    """What to convert: the signature's concrete function, the table pipeline's graph, or a rewrite."""

    def __init__(self, loaded: LoadedSavedModel, frozen: FrozenSignature, prepared: PreparedGraph | None) -> None:
        self.loaded, self.frozen, self.prepared = loaded, frozen, prepared

    @cached_property
    def _spliced(self) -> Any:
        """The table pipeline's graph, spliced once for the first conversion and any rewrite of it."""
        assert self.prepared is not None
        return self.prepared.graph_def("tflite")

    @property
    def rebuilt_prefix_tables(self) -> set[str]:
        """Tables the pipeline rebuilds at run time with only the rows the sequence length reads."""
        if self.prepared is None:
            return set()
        return set(self.prepared.prefix_only) & set(self.prepared.replacements)

    def graph(self) -> tuple[Any, dict[str, str], dict[str, str]]:
        """(GraphDef, inputs, outputs) that a rewrite starts from."""
        if self.prepared is not None:
            return self._spliced, self.prepared.inputs, self.prepared.outputs
        return self.frozen.graph()

    @property
    def converts_saved_model(self) -> bool:
        """True when the plain conversion is the SavedModel's own signature, as it is."""
        return self.prepared is None and self.frozen.name is not None and self.frozen.native_specs

    def converter(self, graph_def: Any | None) -> Any:
        """A TFLiteConverter over ``graph_def`` (with this source's inputs and outputs, weights bound), else the
        source: the SavedModel itself where the export keeps its signature as it is (the converter's own
        importer, which freezes without a Python copy of the weights: 3.7 GB against 5.0 GB at BERT-base)."""
        tf = import_tensorflow()
        if graph_def is None and self.prepared is None:
            if self.converts_saved_model:
                path, keys = str(self.loaded.path), [self.frozen.name]
                return tf.lite.TFLiteConverter.from_saved_model(path, signature_keys=keys)
            return tf.lite.TFLiteConverter.from_concrete_functions([self.frozen.concrete], self.loaded.obj)
        own, inputs, outputs = self.graph()
        bound = self.frozen.weights.bind(own if graph_def is None else graph_def)
        concrete, holder = concrete_from_graph_def(bound, inputs, outputs)
        del bound  # the function holds its own copy
        return tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder)


def _convert(
    source: _GraphSource,
    options: ExportOptions,
    calibration: Callable[[], Iterator[dict[str, np.ndarray]]] | None,
    *,
    allow_flex: bool,
    quiet: bool,
    graph: Any | None = None,
) -> tuple[bytes, str]:
    converter = source.converter(graph)
    dataset = None if calibration is None else _representative_dataset(calibration, source.frozen.specs)
    configure_converter(
        converter, options.precision_spec("tflite"), allow_flex=allow_flex, representative_dataset=dataset
    )
    failure: Exception | None
    with capture_native_output(quiet) as log:
        try:
            data = converter.convert()
        except Exception as err:  # ConverterError, and ValueError/TypeError from tracing
            failure = err
        else:
            failure = None
    if failure is not None:
        raise ConversionError(f"TFLite converter failed: {converter_error_summary(failure)}") from failure
    if not summarize_tflite_bytes(data, source.loaded.path).signatures:
        # The converter falls back silently to a path that writes no SignatureDef; no runner can use that file.
        raise ConversionError(
            "the TFLite converter wrote no SignatureDef (its SavedModel step failed); "
            "this is a pe-export bug worth reporting with the model"
        )
    return data, log.text


def configure_converter(
    converter: Any,
    quantize: Precision,
    *,
    allow_flex: bool,
    representative_dataset: Callable[[], Iterator[list[np.ndarray]]] | None = None,
) -> None:
    """Op sets and quantization of a TFLiteConverter for an export's --quantize (and --builtins-only)."""
    tf = import_tensorflow()
    ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantize.converter_optimizes or quantize.integer_kernels:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantize.converter_types:
        converter.target_spec.supported_types = [getattr(tf, name) for name in quantize.converter_types]
    if quantize.integer_kernels:
        if representative_dataset is None:
            raise ValueError("int8 quantization needs calibration inputs")
        converter.representative_dataset = representative_dataset
        # Full-integer kernels first; float builtins only where no int8 kernel exists.
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
    if allow_flex:
        ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
    converter.target_spec.supported_ops = ops


def _representative_dataset(
    calibration: Callable[[], Iterator[dict[str, np.ndarray]]], specs: list[TensorSpec]
) -> Callable[[], Iterator[list[np.ndarray]]]:
    def generate() -> Iterator[list[np.ndarray]]:
        for feed in calibration():
            yield [feed[spec.name] for spec in specs]

    return generate


def converter_error_summary(error: Exception) -> str:
    """The converter's first real error line and the ops it could not convert, in one line."""
    text = str(error)
    errors = [m.group(1).strip() for m in _ERROR_LINE.finditer(text)]
    errors = [e for e in errors if not e.startswith("failed while converting")] or errors
    ops = sorted({op.strip() for m in _OPS_LINE.finditer(text) for op in m.group(1).split(",")})
    head = errors[0] if errors else (text.strip().splitlines() or [type(error).__name__])[0]
    return head + (f" (ops it could not convert: {', '.join(ops)})" if ops else "")
