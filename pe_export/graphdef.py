"""GraphDef helpers for the table pipeline and the converters alike (TensorFlow side): reading nodes,
constants and consumers, and turning a GraphDef back into a concrete function."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from pe_export.native import import_tensorflow

STAND_IN_ATTR = "_pe_export_stand_in"  # on a Placeholder: "this is a frozen weight, bound before conversion"

# tensorflow.DataType enum values, for attributes read or written without importing TensorFlow's dtypes.
DT_FLOAT, DT_INT32, DT_INT64, DT_BOOL, DT_HALF = 1, 3, 9, 10, 19


def node_name(tensor: str) -> str:
    return tensor.split(":")[0].lstrip("^")


def const_value(node: Any) -> np.ndarray:
    """The value of a Const node."""
    from tensorflow.python.framework import tensor_util

    return tensor_util.MakeNdarray(node.attr["value"].tensor)


def consumers_of(graph_def: Any) -> dict[str, list[tuple[Any, int]]]:
    """Node name → (consuming node, input position) for every data input (control inputs left out)."""
    consumers: dict[str, list[tuple[Any, int]]] = {}
    for node in graph_def.node:
        for position, source in enumerate(node.input):
            if not source.startswith("^"):
                consumers.setdefault(node_name(source), []).append((node, position))
    return consumers


class GraphIndex:
    """Nodes, consumers and (lazily) static shapes of one GraphDef."""

    def __init__(self, graph_def: Any) -> None:
        self.graph_def = graph_def
        self.nodes = {node.name: node for node in graph_def.node}
        self.consumers = consumers_of(graph_def)

    def source(self, tensor: str) -> Any:
        return self.nodes.get(node_name(tensor))

    @cached_property
    def _graph(self) -> Any:
        tf = import_tensorflow()
        with tf.Graph().as_default() as graph:
            tf.compat.v1.import_graph_def(self.graph_def, name="")
        return graph

    def shape(self, tensor: str) -> list[int | None] | None:
        """The static shape of a tensor (None where unknown)."""
        name = tensor if ":" in tensor else tensor + ":0"
        try:
            shape = self._graph.get_tensor_by_name(name.lstrip("^")).shape
        except (KeyError, ValueError):
            return None
        return None if shape.rank is None else shape.as_list()

    @cached_property
    def runtime(self) -> set[str]:
        """Nodes whose value depends on a graph input (computed at run time); a weight stand-in is no input."""
        result: set[str] = set()
        order = _topological(self.graph_def, self.nodes)
        for node in order:
            is_input = node.op == "Placeholder" and STAND_IN_ATTR not in node.attr
            if is_input or any(node_name(i) in result for i in node.input if not i.startswith("^")):
                result.add(node.name)
        return result

    def const_value(self, tensor: str) -> np.ndarray | None:
        node = self.source(tensor)
        while node is not None and node.op == "Identity":
            node = self.source(node.input[0])
        if node is None or node.op != "Const":
            return None
        return const_value(node)


def _topological(graph_def: Any, nodes: dict[str, Any]) -> list[Any]:
    done: set[str] = set()
    order: list[Any] = []
    for start in graph_def.node:
        stack = [(start, False)]
        while stack:
            node, expanded = stack.pop()
            if node.name in done:
                continue
            if expanded:
                done.add(node.name)
                order.append(node)
                continue
            stack.append((node, True))
            for tensor in node.input:
                source = nodes.get(node_name(tensor))
                if source is not None and source.name not in done:
                    stack.append((source, False))
    return order


def concrete_from_graph_def(graph_def: Any, inputs: dict[str, str], outputs: dict[str, str]) -> tuple[Any, Any]:
    """(concrete function, trackable holding it) over a GraphDef, inputs and outputs by user-facing names."""
    tf = import_tensorflow()
    graph_def = without_custom_gradients(graph_def)

    def load() -> None:
        tf.compat.v1.import_graph_def(graph_def, name="")

    wrapped = tf.compat.v1.wrap_function(load, [])
    graph = wrapped.graph
    feeds = [graph.get_tensor_by_name(tensor) for tensor in inputs]
    fetches = {name: graph.get_tensor_by_name(tensor) for tensor, name in outputs.items()}
    pruned = wrapped.prune(feeds, fetches)
    # A pruned function has no signature; the TFLite converter names inputs and outputs from one.
    specs = [
        tf.TensorSpec(feed.shape, feed.dtype, name=name) for feed, name in zip(feeds, inputs.values(), strict=True)
    ]

    def serve(*args: Any) -> Any:
        return pruned(*args)

    function = tf.function(serve, input_signature=specs, autograph=False)
    holder = tf.Module()
    holder.serve = function  # the TFLite converter writes a signature only for a tracked function
    return function.get_concrete_function(), holder


def without_custom_gradients(graph_def: Any) -> Any:
    """A copy without custom-gradient markers (keras-hub's RoPE and others carry them).

    The TFLite converter saves a concrete function as a SavedModel to write its SignatureDef; a
    custom gradient whose function captures a tensor makes that save fail, and the converter then
    silently falls back to a path that writes no signature. An export never needs gradients.
    """
    marked = [node for node in graph_def.node if "_gradient_op_type" in node.attr]
    if not marked:
        return graph_def
    result = type(graph_def)()
    result.CopyFrom(graph_def)
    for node in result.node:
        if "_gradient_op_type" in node.attr:
            del node.attr["_gradient_op_type"]
    return result
