"""One ONNX graph's producers, consumers and constants, and the shape arithmetic tf2onnx writes, read through
it: what the fusions and the projections' rewrite both read the graph with."""

from __future__ import annotations

from typing import Any

import numpy as np

from pe_export.converters.onnx.rewrites import names_read_by


class GraphView:
    """Producers, consumers and constants of one graph, as it stands when made."""

    def __init__(self, graph: Any, ranks: dict[str, int]) -> None:
        from onnx import numpy_helper

        self.ranks = ranks
        self.producer = {output: node for node in graph.node for output in node.output}
        self.consumers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in dict.fromkeys(node.input):
                self.consumers.setdefault(name, []).append(node)
            for attribute_graph in subgraphs(node):  # a subgraph's reads count as its node's
                for name in names_read_by(attribute_graph.node):
                    self.consumers.setdefault(name, []).append(node)
        self.outputs = {value.name for value in graph.output}
        self._initializers = {init.name: init for init in graph.initializer}
        self._to_array = numpy_helper.to_array

    def constant(self, name: str) -> np.ndarray | None:
        if name in self._initializers:
            return np.asarray(self._to_array(self._initializers[name]))
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            return np.asarray(self._to_array(node.attribute[0].t))
        return None

    @property
    def initializer_names(self) -> set[str]:
        return set(self._initializers)

    def initializer(self, name: str) -> Any:
        return self._initializers[name]

    def constant_value(self, name: str, depth: int = 8) -> np.ndarray | None:
        """``constant``, or the value of a chain of shape arithmetic and weight reshaping on constants (tf2onnx
        computes an einsum's weight shape from Constant nodes that only a runtime would fold), or None."""
        value = self.constant(name)
        node = self.producer.get(name)
        if value is not None or node is None or depth == 0 or node.op_type not in _EVALUATED:
            return value
        arrays = [self.constant_value(n, depth - 1) for n in node.input if n]
        if any(a is None for a in arrays) or not arrays:
            return None
        return _evaluated(node, [a for a in arrays if a is not None])

    def dims(self, name: str) -> list[int] | None:
        """An initializer's shape, read without its values."""
        initializer = self._initializers.get(name)
        return None if initializer is None else [int(d) for d in initializer.dims]

    def only_reader(self, name: str, op_type: str) -> Any | None:
        """The one node that reads ``name``, where it is an ``op_type`` and ``name`` is no graph output."""
        readers = self.consumers.get(name, [])
        if name in self.outputs or len(readers) != 1 or readers[0].op_type != op_type:
            return None
        return readers[0]

    def readers(self, name: str) -> list[Any]:
        return [] if name in self.outputs else self.consumers.get(name, [])


_EVALUATED = {"Gather", "Concat", "ReduceProd", "Transpose", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Identity"}


def subgraphs(node: Any) -> list[Any]:
    from onnx import AttributeProto

    found = []
    for attribute in node.attribute:
        if attribute.type == AttributeProto.GRAPH:
            found.append(attribute.g)
        elif attribute.type == AttributeProto.GRAPHS:
            found.extend(attribute.graphs)
    return found


def shape_indices(name: str, source: str, view: GraphView) -> list[int] | None:
    """The dimensions of ``source`` that ``name`` holds, where it is a Gather (axis 0) of Shape(source) by
    constant indices, through Casts between int32 and int64 (how tf2onnx spells a tensor's own dimensions)."""
    gather = through_casts(name, view)
    if gather is None or gather.op_type != "Gather" or any(a.name == "axis" and a.i != 0 for a in gather.attribute):
        return None
    shape_of, indices = through_casts(gather.input[0], view), view.constant_value(gather.input[1])
    if shape_of is None or shape_of.op_type != "Shape" or shape_of.attribute or shape_of.input[0] != source:
        return None
    return None if indices is None else [int(i) for i in indices.reshape(-1)]


def through_casts(name: str, view: GraphView) -> Any | None:
    node = view.producer.get(name)
    while node is not None and node.op_type == "Cast":
        node = view.producer.get(node.input[0])
    return node


def _evaluated(node: Any, arrays: list[np.ndarray]) -> np.ndarray | None:
    """``node`` (an op of ``_EVALUATED``) computed on constant inputs with numpy, or None for a form not handled."""
    from onnx import helper

    from pe_export.converters.onnx.weights import _evaluate

    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Gather":
        return np.take(arrays[0], arrays[1], axis=int(attributes.get("axis", 0)))
    if node.op_type == "Concat":
        return np.concatenate([np.atleast_1d(a) for a in arrays], axis=int(attributes["axis"]))
    if node.op_type == "ReduceProd":
        axes = attributes.get("axes", arrays[1].tolist() if len(arrays) > 1 else None)
        keep = bool(attributes.get("keepdims", 1))
        return np.prod(arrays[0], axis=None if axes is None else tuple(axes), keepdims=keep).astype(arrays[0].dtype)
    return _evaluate(node.op_type, arrays, attributes)
