"""Full-integer TFLite (``tflite --quantize int8``): int8 or int16 activations, int8 weights per output channel,
integer kernels from the inputs to the outputs, for NPUs and DSPs that run nothing else.

The TFLite converter's own full-int8 file loses a Transformer's answers (all-MiniLM-L6-v2, held-out worst pooled
cosine 0.41) and its 16x8 mode fails on int32 token inputs, so the float32 file is quantized by ai-edge-quantizer
(static activations × int8 weights, the recipe its NPU path uses) after the rewrites of what integer arithmetic
cannot hold (pe_export/converters/tflite/integer_rewrites.py). Here: calibration (once), quantizing at the activation
precisions asked per op (pe_export/converters/tflite/mixed.py chooses them), and what the file is made of.

Measured on all-MiniLM-L6-v2, 48 varied sentences given, 32 others judged one per call (worst pooled cosine vs
float32 TensorFlow, every activation int16): ai-edge-quantizer a16w8 as is 0.407 (LayerNorm's squares in float);
mask fill bounded 0.978; every op integer 0.979; LayerNorm normalized 0.9915.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pe_export.converters.tflite.integer_rewrites import IntegerGraph, integer_ready, set_constants_in_place
from pe_export.errors import ConversionError
from pe_export.memory import release_freed_memory
from pe_export.native import capture_native_output

ACTIVATION_BITS = 16
WEIGHT_BITS = 8
MASK_FILL_MARGIN = 25.0  # e^-25 ≈ 1.4e-11: a masked position's weight beside the row's largest score
VARIANCE_HEADROOM = 2.0  # the normalized LayerNorm variance's range over what calibration saw
# Every int16 activation's range over what calibration saw (after the above): a short sentence concentrates attention
# on few tokens, and its attention contexts and scores overshoot ranges calibrated on longer ones. all-MiniLM-L6-v2,
# 48 varied sentences calibrating, "Thanks a lot!" (never given): contexts at 1.43x and 1.98x of their calibrated
# range, scores at 1.39x, clipped; worst pooled cosine 0.978. Twice the range costs int16 one bit of fifteen.
# Measured (activations int16 or int8 by the search; chosen on / held out / 24 and 24 later sentences): as seen
# 0.96412 / 0.99161 / 0.97798 / 0.98361; int16 ranges x2 0.99359 / 0.99656 / 0.99534 / 0.99654. int8 ranges x2 too
# lost the learned-table reference's default export; every range x4 rounded a LayerNorm's row peak, an int8 DIV's
# divisor, to zero.
ACTIVATION_HEADROOM = 2.0
_QUANTIZER_EXTRA = "pip install 'pe-export[convert]' (ai-edge-quantizer)"


@dataclass
class IntegerFile:
    """A full-integer file and what was done to make it."""

    model: bytes
    rewrites: Counter[str] = field(default_factory=Counter)
    precisions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (op, precision) → count
    float_ops: list[str] = field(default_factory=list)  # ops left with a float tensor, by output name
    dynamic_inputs: list[str] = field(default_factory=list)  # inputs with a dynamic axis
    floats_asked: bool = False  # --keep-float left ops float (with a DEQUANTIZE and a QUANTIZE around each)

    def notes(self) -> list[str]:
        done = ", ".join(f"{count} {what}" for what, count in sorted(self.rewrites.items()))
        table = Counter[str]()
        for (_, precision), count in self.precisions.items():
            table[precision] += count
        kinds = [f"int{bits}" for bits in (8, ACTIVATION_BITS) if any(p.startswith(f"int{bits}") for p in table)]
        notes = [
            f"full integer: {' and '.join(kinds) or 'no integer'} activations, int{WEIGHT_BITS} weights per output "
            f"channel (ai-edge-quantizer); rewritten for integer kernels: {done or 'nothing'}"
        ]
        notes.append("ops by precision: " + ", ".join(f"{p} {c}" for p, c in sorted(table.items())))
        if self.dynamic_inputs:
            notes.append(
                f"dynamic input shapes ({', '.join(self.dynamic_inputs)}): an NPU compiles fixed ones, and static "
                "ranges hold best at the length they were calibrated at; export with --batch 1 --seq-len N"
            )
        if self.float_ops:
            notes.append(
                f"{len(self.float_ops)} op(s) still float ("
                + (
                    "no integer kernel, or --keep-float and the conversions around it"
                    if self.floats_asked
                    else "no integer kernel"
                )
                + "): "
                + ", ".join(self.float_ops[:8])
            )
        return notes


@dataclass
class Calibrated:
    """The integer-ready file (the rewrites, the mask fills bounded) and its tensors' calibrated ranges: what
    every activation precision is quantized from."""

    data: bytes
    ranges: dict[str, Any]
    rewrites: Counter[str]
    # each op's scope by its first output's name, and the outputs' virtual op's scope with the ops writing them
    # (``_op_scopes``): parsed once, not per quantized candidate (MiniLM's file is 90 MB)
    scopes: dict[str, str] = field(default_factory=dict)
    outputs: tuple[str, set[str]] = ("", set())


def calibrate(float_file: bytes, feeds: Iterable[dict[str, np.ndarray]], order: list[str] | None = None) -> Calibrated:
    """``float_file`` (float32 TFLite) rewritten for integer kernels and calibrated on ``feeds``: inputs by the
    signature's names, or by ``order`` (the names the feeds use, in the signature's input order) where those
    differ."""
    quantizer = _quantizer_module()
    prepared = integer_ready(float_file)
    key = _signature_key(prepared.data)
    inputs = _input_names(prepared.data)
    samples = [_by_signature(feed, inputs, order) for feed in feeds]
    if not samples:
        raise ConversionError("--quantize int8 needs calibration inputs (--text, --inputs or generated ones)")
    recipes = quantizer.recipe_manager.RecipeManager()
    recipes.load_quantization_recipe(_recipe())
    # The quantizer's calibrator itself, given the file's bytes: Quantizer.calibrate hands it a memoryview of a
    # bytearray copy, and its interpreter copies that once more (bytes of bytes is the same object); two copies of
    # the model fewer at calibration's peak (BERT-large: 2.7 GB)
    profiler = quantizer.calibrator.CalibrationMode.CALIBRATION_PROFILER_BASED
    calibrating = quantizer.calibrator.Calibrator(prepared.data, num_threads=os.cpu_count() or 1, mode=profiler)
    with _quiet():  # its progress bars
        # min/max kept by the interpreter as it runs (CALIBRATION_PROFILER_BASED), not by keeping every tensor and
        # copying it out (the default): the same ranges for every float activation (it leaves out int32 shape
        # tensors), to float32 rounding; MiniLM at 8x128: 1.0 s and +0.1 GB where the default took 9.7 s and
        # +2.8 GB; BERT-base's full-integer export peaked at 17.1 GB with the default
        calibrating.calibrate({key: samples}, recipes)
    ranges = calibrating.get_model_qsvs()
    del calibrating  # its interpreter and XNNPACK's packed weights
    empty = sorted(name for name, bounds in ranges.items() if not bounds)
    if empty:
        raise ConversionError(
            f"calibration left {len(empty)} tensor(s) without a range ({', '.join(empty[:3])}): the calibration "
            "inputs never reached them; give inputs that run the whole signature (--text, --inputs)"
        )
    fills: dict[int, float] = {}  # one fill per constant: the converter shares one -1e9 among the layers' selects
    for constant, scores, _ in prepared.fills:
        bounds = ranges[prepared.names[scores]]
        peak = float(max(np.abs(np.asarray(bounds["min"])).max(), np.abs(np.asarray(bounds["max"])).max()))
        fills[constant] = min(fills.get(constant, 0.0), -(peak + MASK_FILL_MARGIN))
    for constant, _, output in prepared.fills:
        selected = ranges[prepared.names[output]]
        selected["min"] = np.full_like(np.asarray(selected["min"]), fills[constant])
    for name in prepared.variances:
        if name in ranges:
            ranges[name]["max"] = np.asarray(ranges[name]["max"]) * VARIANCE_HEADROOM
    data = set_constants_in_place(prepared.data, fills)
    del prepared.data
    release_freed_memory()
    return Calibrated(data, ranges, prepared.rewrites, *_op_scopes(data))


def quantize(
    calibrated: Calibrated,
    int16: Collection[str] = (),
    floats: Collection[str] = (),
    *,
    default_bits: int = ACTIVATION_BITS,
) -> bytes:
    """The calibrated file quantized: activations of ``default_bits``, int16 for the ops ``int16`` names and
    float for those ``floats`` names (ops by their first output's name, ``activation_ops``); weights int8 per
    output channel. Its outputs are the integer tensors (``finish`` adds the float32 ends)."""
    quantizer = _quantizer_module()
    scopes, outputs = calibrated.scopes, calibrated.outputs
    recipe = _recipe(default_bits)
    if int16:
        int16 = set(int16)
        if outputs[1] & int16:  # an int16 result is not narrowed to int8 on its way out
            scopes = {**scopes, outputs[0]: outputs[0]}
            int16.add(outputs[0])
        recipe += _recipe(ACTIVATION_BITS, _scope_regex(scopes, int16))
    if floats:
        recipe.append({"regex": _scope_regex(scopes, floats), "operation": "*", "algorithm_key": "no_quantize"})
    quantizing = quantizer.Quantizer(calibrated.data)  # bytes: read in place (it never writes them), not copied
    # calibrate() checked the ranges (none empty, ai-edge-quantizer's own check); that check builds an interpreter
    # of the float model on every call, a copy of it and XNNPACK's packing (BERT-large: 2.7 GB, 2 s a candidate)
    quantizing._ensure_model_qsv_sufficient = lambda _ranges: None
    quantizing.load_quantization_recipe(recipe)
    widened = _with_headroom(calibrated.ranges, None if default_bits == ACTIVATION_BITS else set(int16))
    with _quiet():
        return bytes(quantizing.quantize(widened).quantized_model)


def _with_headroom(ranges: dict[str, dict[str, Any]], names: Collection[str] | None) -> dict[str, dict[str, Any]]:
    """``ranges`` with those of the int16 activations, ``names`` (ops by their first output's name; None: every
    one), ``ACTIVATION_HEADROOM`` times as wide: int16 has the bits to spare, int8 does not (the learned-table
    reference with every int8 activation widened too: its default export refused, max abs 0.86 against 0.5)."""
    return {
        name: {
            **bounds,
            "min": np.asarray(bounds["min"]) * ACTIVATION_HEADROOM,
            "max": np.asarray(bounds["max"]) * ACTIVATION_HEADROOM,
        }
        if names is None or name in names
        else bounds
        for name, bounds in ranges.items()
    }


def finish(calibrated: Calibrated, model: bytes, *, floats_asked: bool = False) -> IntegerFile:
    """``model`` (``quantize``'s) with float32 outputs, and what it is made of."""
    data = _float_outputs(model)
    precisions, float_ops = op_precisions(data)
    return IntegerFile(data, calibrated.rewrites, precisions, float_ops, _dynamic_inputs(data), floats_asked)


def full_integer(
    float_file: bytes, feeds: Iterable[dict[str, np.ndarray]], order: list[str] | None = None
) -> IntegerFile:
    """``float_file`` as a full-integer file with every activation int16, calibrated on ``feeds``
    (``calibrate``)."""
    calibrated = calibrate(float_file, feeds, order)
    return finish(calibrated, quantize(calibrated))


@dataclass(frozen=True)
class ActivationOp:
    """An op of the integer-ready file whose output is a float activation: what takes int8 or int16."""

    name: str  # its first output's name: the handle --keep-int16 and the search use
    code: str  # the builtin op's name
    shape: tuple[int, ...]
    elements: int  # its output's values (1 where a dynamic axis hides them)


def activation_ops(data: bytes) -> list[ActivationOp]:
    """The ops of ``data`` (``Calibrated.data``) that write a float activation, in graph order."""
    graph = IntegerGraph(data)
    codes = {value: key for key, value in vars(graph.ops).items() if not key.startswith("_")}
    found = []
    for op in graph.graph.operators:
        outputs = [int(o) for o in op.outputs if int(o) >= 0]
        tensors = [graph.graph.tensors[o] for o in outputs]
        if not tensors or tensors[0].type != graph.schema.TensorType.FLOAT32:
            continue
        shape = tuple(int(d) for d in (tensors[0].shape if tensors[0].shape is not None else ()))
        signature = tensors[0].shapeSignature
        dynamic = signature is not None and any(int(d) < 0 for d in signature)
        elements = 1 if dynamic else int(np.prod(shape)) if shape else 1
        found.append(ActivationOp(graph.name(outputs[0]), codes.get(graph.code(op), "?"), shape, elements))
    return found


def _op_scopes(data: bytes) -> tuple[dict[str, str], tuple[str, set[str]]]:
    """Each op's scope as ai-edge-quantizer matches recipes on it (its outputs' names, each followed by ';'),
    by its first output's name; and the scope of the quantizer's virtual op that reads the graph's outputs (the
    last requantize), with the ops (by first output name) that write them. Read in place (no copy of the file)."""
    from tensorflow.lite.python import schema_py_generated as schema

    graph = schema.Model.GetRootAs(data, 0).Subgraphs(0)

    def name(index: int) -> str:
        return graph.Tensors(index).Name().decode()

    scopes, writers = {}, {}
    for position in range(graph.OperatorsLength()):
        op = graph.Operators(position)
        names = [name(op.Outputs(j)) for j in range(op.OutputsLength()) if op.Outputs(j) >= 0]
        names = [found for found in names if found]
        if names:
            scopes[names[0]] = "".join(f"{found};" for found in names)
            writers.update({found: names[0] for found in names})
    outputs = [name(graph.Outputs(j)) for j in range(graph.OutputsLength())]
    return scopes, ("".join(f"{found};" for found in outputs), {writers[n] for n in outputs if n in writers})


def _scope_regex(scopes: dict[str, str], ops: Collection[str]) -> str:
    """A regular expression that matches exactly the scopes of ``ops`` (by first output name)."""
    missing = sorted(set(ops) - set(scopes))
    if missing:
        raise ConversionError(f"ops {missing[:3]} are not in the file being quantized: a pe-export bug")
    return "^(?:" + "|".join(re.escape(scopes[name]) for name in sorted(set(ops))) + ")$"


def _quantizer_module() -> Any:
    try:
        from ai_edge_quantizer import quantizer
    except ImportError as err:
        raise ConversionError(f"--quantize int8 for TFLite needs ai-edge-quantizer: {_QUANTIZER_EXTRA}") from err
    return quantizer


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """ai-edge-quantizer's progress bars (Python's sys.stderr) and prints (stdout), and anything native, unshown."""
    with capture_native_output(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def _float_outputs(data: bytes) -> bytes:
    """Each quantized output dequantized to float32 by a last DEQUANTIZE, as the TFLite converter's full-integer
    files end: a caller reads real values, whatever the output's scale."""
    graph = IntegerGraph(data)
    schema, signature = graph.schema, graph.model.signatureDefs[0]
    renamed = {}
    for position, index in enumerate(list(graph.graph.outputs)):
        tensor = graph.graph.tensors[int(index)]
        if tensor.type not in (schema.TensorType.INT16, schema.TensorType.INT8) or tensor.quantization is None:
            continue
        real = graph.tensor_like(int(index), "/dequantized")
        graph.graph.tensors[real].name = tensor.name  # the output keeps its name; the integer tensor is renamed
        tensor.name = tensor.name + b"/quantized"
        graph.graph.operators.append(graph.op(graph.ops.DEQUANTIZE, [int(index)], [real]))
        graph.graph.outputs[position] = real
        renamed[int(index)] = real
    for entry in signature.outputs:
        entry.tensorIndex = renamed.get(int(entry.tensorIndex), entry.tensorIndex)
    return graph.bytes() if renamed else data


def _recipe(activation_bits: int = ACTIVATION_BITS, regex: str = ".*") -> list[dict[str, Any]]:
    """ai-edge-quantizer's static recipe of ``activation_bits`` activations and int8 weights (its default_a16w8 at
    16), for the ops whose scope ``regex`` matches."""
    return [
        {
            "regex": regex,
            "operation": "*",
            "algorithm_key": "min_max_uniform_quantize",
            "op_config": {
                "activation_tensor_config": {
                    "num_bits": activation_bits,
                    "symmetric": True,
                    "granularity": "TENSORWISE",
                    "dtype": "INT",
                },
                "weight_tensor_config": {
                    "num_bits": WEIGHT_BITS,
                    "symmetric": True,
                    "granularity": "CHANNELWISE",
                    "dtype": "INT",
                },
                "compute_precision": "INTEGER",
                "explicit_dequantize": False,
                "skip_checks": False,
                "min_weight_elements": 0,
            },
        }
    ]


def _interpreter(data: bytes) -> Any:
    """An interpreter to read ``data``'s signatures, tensors and ops from, never run: without XNNPACK, which
    would pack a float file's weights (a copy of them) and stand in for the ops it takes."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType  # ai-edge-quantizer's own runtime

    return Interpreter(
        model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    )


def _signature_key(data: bytes) -> str:
    signatures = list(_interpreter(data).get_signature_list())
    if not signatures:
        raise ConversionError("the float32 TFLite file has no signature to calibrate through")
    return str(signatures[0])


def _input_names(data: bytes) -> list[str]:
    """The first signature's inputs, in the order of the graph's inputs (the converter's order of the specs)."""
    interpreter = _interpreter(data)
    key = next(iter(interpreter.get_signature_list()))
    runner = interpreter.get_signature_runner(key)
    details = runner.get_input_details()
    return sorted(details, key=lambda name: details[name]["index"])


def _dynamic_inputs(data: bytes) -> list[str]:
    details = _interpreter(data).get_input_details()
    return [d["name"] for d in details if any(int(n) < 0 for n in d.get("shape_signature", d["shape"]))]


def _by_signature(feed: dict[str, np.ndarray], inputs: list[str], order: list[str] | None) -> dict[str, np.ndarray]:
    if all(name in feed for name in inputs):
        return {name: feed[name] for name in inputs}
    if order is not None and len(order) == len(inputs) and all(name in feed for name in order):
        return {name: feed[given] for name, given in zip(inputs, order, strict=True)}
    raise ConversionError(
        f"calibration inputs {sorted(feed)} do not match the TFLite signature's inputs {inputs}: a pe-export bug"
    )


_FLOAT_TYPES = ("float32", "float16", "float64")


def op_precisions(data: bytes) -> tuple[Counter[tuple[str, str]], list[str]]:
    """((op, precision) → count, the ops with a float tensor). An op's precision is its activations' widest
    integer type and its weights' ('int16×int8'), 'index' for int32/bool-only ops, 'shape' for what reads only a
    shape, 'output' for the last DEQUANTIZE of an output, 'float' for any other op with a float tensor."""
    interpreter = _interpreter(data)
    details = {t["index"]: t for t in interpreter.get_tensor_details()}
    ops = interpreter._get_ops_details()
    readers: dict[int, list[str]] = {}
    for op in ops:
        for index in op["inputs"]:
            readers.setdefault(int(index), []).append(op["op_name"])
    outputs = {int(d["index"]) for d in interpreter.get_output_details()}
    precisions: Counter[tuple[str, str]] = Counter()
    float_ops = []
    for op in ops:
        tensors = [details[i] for i in [*op["inputs"], *op["outputs"]] if i >= 0]
        kinds = {np.dtype(t["dtype"]).name for t in tensors}
        written = [int(i) for i in op["outputs"]]
        if op["op_name"] == "SHAPE" or (
            op["op_name"] == "DEQUANTIZE" and all(set(readers.get(i, [])) == {"SHAPE"} for i in written)
        ):
            precision = "shape"  # reads a tensor's shape, never its values (a dynamic axis)
        elif op["op_name"] == "DEQUANTIZE" and set(written) <= outputs:
            precision = "output"  # the last op: the integer result as float32
        elif kinds & set(_FLOAT_TYPES):
            precision = "float"
            float_ops.append(f"{op['op_name']} ({details[op['outputs'][0]]['name']})")
        elif kinds & {"int8", "int16"}:
            out_kinds = {np.dtype(details[i]["dtype"]).name for i in op["outputs"]}
            weights = {np.dtype(details[i]["dtype"]).name for i in op["inputs"][1:] if i >= 0} - out_kinds
            precision = "int16" if "int16" in out_kinds else "int8"
            if "int8" in weights and precision == "int16":
                precision = "int16×int8"
        else:
            precision = "index"
        precisions[(op["op_name"], precision)] += 1
    return precisions, float_ops
