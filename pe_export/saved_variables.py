"""The variables a SavedModel lists (name, dtype, shape), read from saved_model.pb without TensorFlow.

The size checks run before anything is converted, and on the plain TFLite path the exporting process must not
have imported TensorFlow by then (the conversion runs in a child; TensorFlow in the parent adds 0.6 GB to the
export's peak at BERT-base). So this walks protobuf's wire format (pe_export/protowire.py) for the few fields
it needs; their numbers are TensorFlow's public protos (tensorflow/core/protobuf/saved_model.proto, meta_graph.proto,
saved_object_graph.proto, framework/tensor_shape.proto), stable since TF 2.0. tests/test_memory.py checks the
count against the loaded model's variables.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pe_export.protowire import integer, messages, text

SAVED_MODEL_META_GRAPHS = 2  # SavedModel.meta_graphs
META_GRAPH_OBJECT_GRAPH = 7  # MetaGraphDef.object_graph_def
OBJECT_GRAPH_NODES = 1  # SavedObjectGraph.nodes
SAVED_OBJECT_VARIABLE = 7  # SavedObject.variable (oneof kind)
VARIABLE_DTYPE, VARIABLE_SHAPE, VARIABLE_NAME = 1, 2, 6  # SavedVariable
SHAPE_DIM, DIM_SIZE = 2, 1  # TensorShapeProto.dim, Dim.size

# DataType enum (tensorflow/core/framework/types.proto) → bytes per element
DTYPE_BYTES = {1: 4, 2: 8, 3: 4, 4: 1, 5: 2, 6: 1, 9: 8, 10: 1, 14: 2, 17: 2, 19: 2, 22: 4, 23: 8}


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
    for meta_graph in messages(data, SAVED_MODEL_META_GRAPHS):
        for object_graph in messages(meta_graph, META_GRAPH_OBJECT_GRAPH):
            for node in messages(object_graph, OBJECT_GRAPH_NODES):
                for variable in messages(node, SAVED_OBJECT_VARIABLE):
                    found.append(_variable(variable))
    return found


def _variable(data: memoryview | bytes) -> SavedVariable:
    shapes = list(messages(data, VARIABLE_SHAPE))
    shape = tuple(_dim_size(dim) for dim in messages(shapes[-1], SHAPE_DIM)) if shapes else ()
    return SavedVariable(text(data, VARIABLE_NAME), integer(data, VARIABLE_DTYPE), shape)


def _dim_size(data: memoryview | bytes) -> int:
    size = integer(data, DIM_SIZE)
    return size - (1 << 64) if size >= 1 << 63 else size  # int64, two's complement
