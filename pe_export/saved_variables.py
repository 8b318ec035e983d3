"""The variables a SavedModel lists (name, dtype, shape), read from saved_model.pb without TensorFlow.

The size checks run before anything is converted, and on the plain TFLite path the exporting process must not
have imported TensorFlow by then (the conversion runs in a child; TensorFlow in the parent adds 0.6 GB to the
export's peak at BERT-base). So this walks protobuf's wire format for the few fields it needs; their numbers are
TensorFlow's public protos (tensorflow/core/protobuf/saved_model.proto, meta_graph.proto,
saved_object_graph.proto, framework/tensor_shape.proto), stable since TF 2.0. tests/test_memory.py checks the
count against the loaded model's variables.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SAVED_MODEL_META_GRAPHS = 2  # SavedModel.meta_graphs
META_GRAPH_OBJECT_GRAPH = 7  # MetaGraphDef.object_graph_def
OBJECT_GRAPH_NODES = 1  # SavedObjectGraph.nodes
SAVED_OBJECT_VARIABLE = 7  # SavedObject.variable (oneof kind)
VARIABLE_DTYPE, VARIABLE_SHAPE, VARIABLE_NAME = 1, 2, 6  # SavedVariable
SHAPE_DIM, DIM_SIZE = 2, 1  # TensorShapeProto.dim, Dim.size

# DataType enum (tensorflow/core/framework/types.proto) → bytes per element
DTYPE_BYTES = {1: 4, 2: 8, 3: 4, 4: 1, 5: 2, 6: 1, 9: 8, 10: 1, 14: 2, 17: 2, 19: 2, 22: 4, 23: 8}
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


@dataclass(frozen=True)
class SavedVariable:
    name: str
    dtype: int  # TensorFlow's DataType enum value
    shape: tuple[int, ...]  # -1 where unknown

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= max(size, 0)
        return count * DTYPE_BYTES.get(self.dtype, 4)


def saved_variables(saved_model: Path) -> list[SavedVariable]:
    """Every variable node of the SavedModel's object graph(s), in order (a Keras export lists each twice)."""
    data = (Path(saved_model) / "saved_model.pb").read_bytes()
    found = []
    for meta_graph in _messages(data, SAVED_MODEL_META_GRAPHS):
        for object_graph in _messages(meta_graph, META_GRAPH_OBJECT_GRAPH):
            for node in _messages(object_graph, OBJECT_GRAPH_NODES):
                for variable in _messages(node, SAVED_OBJECT_VARIABLE):
                    found.append(_variable(variable))
    return found


def _variable(data: bytes) -> SavedVariable:
    dtype, name = 0, ""
    shape: tuple[int, ...] = ()
    for number, value in _fields(data):
        if number == VARIABLE_DTYPE and isinstance(value, int):
            dtype = value
        elif number == VARIABLE_NAME and isinstance(value, bytes):
            name = value.decode(errors="replace")
        elif number == VARIABLE_SHAPE and isinstance(value, bytes):
            shape = tuple(_dim_size(dim) for dim in _messages(value, SHAPE_DIM))
    return SavedVariable(name, dtype, shape)


def _dim_size(data: bytes) -> int:
    size = 0
    for number, value in _fields(data):
        if number == DIM_SIZE and isinstance(value, int):
            size = value - (1 << 64) if value >= 1 << 63 else value  # int64, two's complement
    return size


def _messages(data: bytes, wanted: int) -> Iterator[bytes]:
    for number, value in _fields(data):
        if number == wanted and isinstance(value, bytes):
            yield value


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one message: an int for varints, the bytes for length-delimited fields
    (fixed-width fields are skipped: none of those read here is one)."""
    position, end = 0, len(data)
    while position < end:
        key, position = _varint(data, position)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, position = _varint(data, position)
            yield number, value
        elif wire == _LENGTH:
            length, position = _varint(data, position)
            yield number, data[position : position + length]
            position += length
        elif wire == _FIXED64:
            position += 8
        elif wire == _FIXED32:
            position += 4
        else:
            raise ValueError(f"saved_model.pb: wire type {wire} at byte {position} is not protobuf's")


def _varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
