"""SavedModel → .tflite bytes with the TFLite converter: op sets, shapes, quantization."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import numpy as np

from pe_export.converters.options import ExportOptions
from pe_export.errors import ConversionError, NeedsFlexError
from pe_export.inspection.tflite_file import summarize_tflite_bytes
from pe_export.native import capture_native_output, import_tensorflow
from pe_export.savedmodel import LoadedSavedModel, wrap_signature
from pe_export.specs import TensorSpec
from pe_export.tables.graph import concrete_from_graph_def
from pe_export.tables.pipeline import PreparedGraph

_ERROR_LINE = re.compile(r"error: (.+)")
_OPS_LINE = re.compile(r"(?:Custom|Flex) ops: (.+)")


def convert_tflite(
    loaded: LoadedSavedModel,
    specs: list[TensorSpec],
    options: ExportOptions,
    calibration: Callable[[], Iterator[dict[str, np.ndarray]]] | None = None,
    *,
    quiet: bool = True,
    prepared: PreparedGraph | None = None,
) -> tuple[bytes, str]:
    """Convert one signature at the given input specs. Returns (flatbuffer, captured converter log).

    ``prepared`` is a rewritten graph (position tables rebuilt at run time) to convert instead.
    """
    try:
        return _convert(
            loaded, specs, options, calibration, allow_flex=not options.builtins_only, quiet=quiet, prepared=prepared
        )
    except ConversionError as err:
        if not options.builtins_only:
            raise
        # Say which ops would need Flex: convert again with select TF ops allowed and read them off.
        try:
            data, _ = _convert(loaded, specs, options, calibration, allow_flex=True, quiet=quiet, prepared=prepared)
        except ConversionError:
            raise err from None
        flex = summarize_tflite_bytes(data, loaded.path).flex_ops
        if not flex:
            raise
        raise NeedsFlexError(
            f"--builtins-only: the model needs select TF (Flex) ops {', '.join(flex)}; drop --builtins-only "
            "to export with Flex (the device then needs a Flex-linked TFLite), or replace those ops"
        ) from None


def _convert(
    loaded: LoadedSavedModel,
    specs: list[TensorSpec],
    options: ExportOptions,
    calibration: Callable[[], Iterator[dict[str, np.ndarray]]] | None,
    *,
    allow_flex: bool,
    quiet: bool,
    prepared: PreparedGraph | None,
) -> tuple[bytes, str]:
    tf = import_tensorflow()
    if prepared is None:
        concrete = wrap_signature(loaded.signature(options.signature), specs)
        converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], loaded.obj)
    else:
        concrete, holder = concrete_from_graph_def(prepared.graph_def("tflite"), prepared.inputs, prepared.outputs)
        converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder)
    ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if options.quantize == "float16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif options.quantize == "dynamic-int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif options.quantize == "int8":
        if calibration is None:
            raise ValueError("int8 quantization needs calibration inputs")
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = _representative_dataset(calibration, specs)
        # Full-integer kernels first; float builtins only where no int8 kernel exists.
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
    if allow_flex:
        ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
    converter.target_spec.supported_ops = ops
    with capture_native_output(quiet) as log:
        try:
            data = converter.convert()
        except Exception as err:  # ConverterError, and ValueError/TypeError from tracing
            failure = err
        else:
            failure = None
    if failure is not None:
        raise ConversionError(f"TFLite converter failed: {converter_error_summary(failure)}") from failure
    return data, log.text


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
