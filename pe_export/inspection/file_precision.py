"""The precision a model file's own tensors state, for a file pe-export did not stamp: int8 where it holds
integer weights or quantize ops, fp16 where it holds float16 weights, else fp32. Read from the mapped file
without a runtime or the onnx package, so the checking process stays light (see onnx_metadata.py)."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import cast

from pe_export.inspection.flatbuffer import CorruptFileError, root_table
from pe_export.inspection.onnx_metadata import GRAPH
from pe_export.inspection.tflite_file import MODEL_SUBGRAPHS, SUBGRAPH_TENSORS, TENSOR_BUFFER, TENSOR_TYPE
from pe_export.inspection.tflite_metadata import MODEL_BUFFERS, buffer_size
from pe_export.protowire import Damaged, integer, integers, messages, text

# TFLite TensorType codes.
_TFLITE_FLOAT16, _TFLITE_INTEGER = 1, {9: "int8", 3: "uint8", 7: "int16"}
# ONNX: GraphProto.node / .initializer, NodeProto.op_type, TensorProto.dims / .data_type; TensorProto codes.
_NODE, _INITIALIZER, _OP_TYPE, _DIMS, _DATA_TYPE = 1, 5, 4, 1, 2
_ONNX_FLOAT16, _ONNX_INTEGER = 10, {2: "uint8", 3: "int8"}
QUANTIZE_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "QLinearMatMul",
        "QLinearConv",
        "DynamicQuantizeMatMul",
        "MatMulNBits",
    }
)
MIN_WEIGHT_ELEMENTS = 1024  # an integer constant this large is a weight, not a mask or an index table


def file_precision(path: Path) -> tuple[str, str]:
    """(fp32 | fp16 | int8, the evidence in words) from what ``path`` holds; the file was checked already."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        data = memoryview(mapped)
        try:
            return _onnx(data) if Path(path).suffix.lower() == ".onnx" else _tflite(cast(bytes, mapped))
        except (CorruptFileError, Damaged):
            return "fp32", "unreadable tensors"  # the runtime's own load says what is wrong with the file
        finally:
            data.release()


def _verdict(integer: dict[str, int], integer_ops: set[str], half: int) -> tuple[str, str]:
    if integer or integer_ops:
        parts = [f"{count} {kind} weight tensor(s)" for kind, count in sorted(integer.items())]
        parts += [f"{', '.join(sorted(integer_ops))} ops"] if integer_ops else []
        return "int8", " and ".join(parts)
    if half:
        return "fp16", f"{half} float16 weight tensor(s)"
    return "fp32", "float32 tensors only"


def _tflite(data: bytes) -> tuple[str, str]:
    model = root_table(data)
    sizes = [buffer_size(buffer) for buffer in model.tables(MODEL_BUFFERS)]
    integer: dict[str, int] = {}
    integer_ops: set[str] = set()
    half = 0
    for subgraph in model.tables(MODEL_SUBGRAPHS):
        for tensor in subgraph.tables(SUBGRAPH_TENSORS):
            kind, buffer = int(tensor.scalar(TENSOR_TYPE, "b")), int(tensor.scalar(TENSOR_BUFFER, "I"))
            constant = 0 < buffer < len(sizes) and sizes[buffer] > 0
            if kind in _TFLITE_INTEGER and constant:
                integer[_TFLITE_INTEGER[kind]] = integer.get(_TFLITE_INTEGER[kind], 0) + 1
            elif kind in (9, 7) and not constant:
                integer_ops.add("integer activation")  # full-integer arithmetic
            elif kind == _TFLITE_FLOAT16 and constant:
                half += 1
    return _verdict(integer, integer_ops, half)


def _onnx(data: memoryview) -> tuple[str, str]:
    integer_weights: dict[str, int] = {}
    integer_ops: set[str] = set()
    half = 0
    for graph in messages(data, GRAPH):
        integer_ops |= {text(node, _OP_TYPE) for node in messages(graph, _NODE)} & QUANTIZE_OPS
        for tensor in messages(graph, _INITIALIZER):
            data_type, elements = integer(tensor, _DATA_TYPE), 1
            for size in integers(tensor, _DIMS):
                elements *= size
            if data_type in _ONNX_INTEGER and elements >= MIN_WEIGHT_ELEMENTS:
                kind = _ONNX_INTEGER[data_type]
                integer_weights[kind] = integer_weights.get(kind, 0) + 1
            elif data_type == _ONNX_FLOAT16:
                half += 1
    return _verdict(integer_weights, integer_ops, half)
