"""ONNX graph clean-ups after tf2onnx that make the file smaller without changing what it computes.

tf2onnx lowers Keras's attention einsums with a Shape of the folded weight: the weight is
stored once for the MatMul (as [512, 512]) and once more, in another layout, only so that a
Shape node can read its dimensions. Those dimensions are known when the file is written, so
the Shape becomes a constant and the copy goes: 6.3 MB (19%) of a d=512, 2-block encoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ShapeFolding:
    shapes_folded: int
    initializers_dropped: int
    bytes_dropped: int


def fold_shapes_of_initializers(model: Any) -> ShapeFolding:
    """In place: every main-graph ``Shape(initializer)`` becomes a Constant; initializers left unused go."""
    from onnx import helper, numpy_helper

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    listed_inputs = {value.name for value in graph.input}  # old-style models list initializers as inputs
    folded = 0
    for node in graph.node:
        if node.op_type != "Shape" or not node.input or node.input[0] not in initializers:
            continue
        dims = list(initializers[node.input[0]].dims)
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        # Shape-15's optional start/end slice the dimensions, Python-style (negative counts from the back).
        dims = dims[attributes.get("start", 0) : attributes.get("end", len(dims))]
        value = numpy_helper.from_array(np.asarray(dims, dtype=np.int64), f"{node.output[0]}__value")
        constant = helper.make_node("Constant", [], list(node.output), name=node.name, value=value)
        node.CopyFrom(constant)
        folded += 1
    used = _names_read(graph) | {value.name for value in graph.output}
    dropped = [init for init in graph.initializer if init.name not in used and init.name not in listed_inputs]
    if dropped:
        kept = [init for init in graph.initializer if init.name in used or init.name in listed_inputs]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    size = sum(int(np.prod(init.dims, dtype=np.int64)) * _itemsize(init.data_type) for init in dropped)
    return ShapeFolding(folded, len(dropped), size)


def _names_read(graph: Any) -> set[str]:
    """Every tensor name a node reads, in this graph and in the subgraphs of If/Loop/Scan nodes."""
    from onnx import AttributeProto

    names: set[str] = set()
    for node in graph.node:
        names.update(name for name in node.input if name)
        for attribute in node.attribute:
            if attribute.type == AttributeProto.GRAPH:
                names |= _names_read(attribute.g)
            elif attribute.type == AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    names |= _names_read(subgraph)
    return names


def _itemsize(data_type: int) -> int:
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(data_type)).itemsize
