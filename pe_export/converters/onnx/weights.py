"""ONNX from a weightless graph: tf2onnx converts the frozen graph with its weight stand-ins as graph inputs, then
each stand-in is bound as an initializer, one weight at a time (pe_export/weights.py).

tf2onnx holds several copies of every weight (the GraphDef, its own graph, a numpy array per node, the model
proto): 17.8 GB at BERT-base shape, killed at BERT-large on a 24 GB machine. Given stand-ins, it holds none; the
weights enter the model proto once. What tf2onnx would have folded into a weight (a Transpose, Cast, Reshape of
it) is folded here with the same numpy operation, so the initializers are the plain path's, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pe_export.converters.onnx.rewrites import remove_initializers

# Ops tf2onnx leaves on a weight it could not fold (it was an input): exact to fold in numpy.
_FOLDABLE = ("Transpose", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Identity")


def stand_in_names(graph_def: Any) -> list[str]:
    from pe_export.weights import is_stand_in

    return [node.name for node in graph_def.node if is_stand_in(node)]


def bind_initializers(model: Any, names: list[str], value: Callable[[str], np.ndarray]) -> int:
    """In place: each graph input named in ``names`` becomes an initializer of ``value(name)``; returns the count.
    Then the weight-only chains tf2onnx left (Transpose and the like of a bound weight) are folded."""
    from onnx import numpy_helper

    graph = model.graph
    wanted = set(names)
    bound = [value_info.name for value_info in graph.input if value_info.name in wanted]
    kept = [value_info for value_info in graph.input if value_info.name not in wanted]
    del graph.input[:]
    graph.input.extend(kept)
    for name in bound:
        graph.initializer.append(numpy_helper.from_array(value(name), name))
    _fold_weight_chains(graph)
    return len(bound)


def _fold_weight_chains(graph: Any) -> None:
    """Nodes of ``_FOLDABLE`` whose inputs are all initializers become initializers (repeated to a fixed point);
    initializers no node reads any more are dropped."""
    from onnx import helper, numpy_helper

    initializers = {init.name: init for init in graph.initializer}
    folded: dict[str, Any] = {}
    kept_nodes = []
    for node in graph.node:  # tf2onnx writes nodes in topological order
        inputs = [name for name in node.input if name]
        if node.op_type not in _FOLDABLE or not inputs or not all(n in initializers for n in inputs):
            kept_nodes.append(node)
            continue
        arrays = [numpy_helper.to_array(initializers[name]) for name in inputs]
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        result = _evaluate(node.op_type, arrays, attributes)
        tensor = numpy_helper.from_array(result, node.output[0])
        initializers[node.output[0]] = tensor
        folded[node.output[0]] = tensor
    if not folded:
        return
    del graph.node[:]
    graph.node.extend(kept_nodes)
    read = {name for node in graph.node for name in node.input} | {output.name for output in graph.output}
    remove_initializers(graph, {init.name for init in graph.initializer if init.name not in read})  # no copies
    graph.initializer.extend(tensor for name, tensor in folded.items() if name in read)


def _evaluate(op: str, arrays: list[np.ndarray], attributes: dict[str, Any]) -> np.ndarray:
    from onnx import helper

    data = arrays[0]
    if op == "Transpose":
        perm = attributes.get("perm")
        return np.ascontiguousarray(np.transpose(data, perm))
    if op == "Cast":
        return data.astype(helper.tensor_dtype_to_np_dtype(attributes["to"]))
    if op == "Reshape":
        shape = [d if d != 0 else data.shape[i] for i, d in enumerate(arrays[1].tolist())]
        return data.reshape(shape)
    if op == "Squeeze":
        axes = tuple(arrays[1].tolist()) if len(arrays) > 1 else attributes.get("axes")
        return np.squeeze(data, axis=None if axes is None else tuple(axes))
    if op == "Unsqueeze":
        axes = arrays[1].tolist() if len(arrays) > 1 else attributes["axes"]
        for axis in sorted(a if a >= 0 else a + data.ndim + len(axes) for a in axes):
            data = np.expand_dims(data, axis)
        return data
    return data  # Identity
