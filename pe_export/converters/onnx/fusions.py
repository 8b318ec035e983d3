"""tf2onnx's spelled-out LayerNorms and Tensordots written as the single ops they compute.

tf2onnx lowers Keras's LayerNormalization to 13 elementwise nodes (two GlobalAveragePools for the mean and the
variance, Sqrt, Reciprocal, the scale and shift in five Muls and Adds) and every Dense on a 3-D input to a
Tensordot: Reshape to 2-D, MatMul, Reshape back by a shape computed from the input's Shape (five more nodes).
onnxruntime's own LayerNorm fusion looks for ReduceMean and finds none, so each node runs: on all-MiniLM-L6-v2
at 14 tokens (one thread, benchmarks/onnx_fusions.py) the float32 file ran 3.99 ms as tf2onnx wrote it and 3.75 ms
with its 13 LayerNorms as one ``LayerNormalization`` (opset 17) and its 12 Tensordots as one MatMul on the 3-D
input (721 -> 481 nodes), where onnxruntime then fuses each residual Add into ``SkipLayerNormalization``;
TensorRT (8.6 and later) takes ``LayerNormalization`` as its normalization layer.

Each rewrite is decided from what the nodes compute, checked value by value: the reductions average over the
last axis of a rank-3 tensor (shape inference on the file without its weights), the scale, shift and epsilon are
constants, every intermediate is read only inside the pattern; the Tensordot's output shape is the input's own
leading dimensions (its Shape, gathered at 0..r-2) and the weight's columns. The rewritten node writes the
pattern's output under its old name, so the layer map and the quantizers see the same tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pe_export.converters.onnx.graph_view import GraphView, shape_indices, through_casts
from pe_export.converters.onnx.projections import collapse_projections
from pe_export.converters.onnx.ranks import tensor_ranks
from pe_export.converters.onnx.rewrites import drop_unread_initializers, names_read_by

LAYER_NORM_OPSET = 17  # LayerNormalization is an ONNX op from opset 17


@dataclass(frozen=True)
class Fusions:
    layer_norms: int
    tensordots: int
    projections: int
    nodes_before: int
    nodes_after: int

    def note(self) -> str | None:
        if not (self.layer_norms or self.tensordots or self.projections):
            return None
        return (
            f"{self.layer_norms} LayerNorm(s) as one LayerNormalization op, {self.tensordots} Tensordot(s) and "
            f"{self.projections} einsum projection(s) as one MatMul on the 3-D input "
            f"({self.nodes_before} -> {self.nodes_after} nodes)"
        )


def fuse_for_runtime(model: Any) -> Fusions:
    """In place: each LayerNorm pattern as ``LayerNormalization`` (where the file's opset has it) and each
    Tensordot as one MatMul; nodes and initializers nothing reads any more go."""
    graph = model.graph
    before = len(graph.node)
    view = GraphView(graph, tensor_ranks(model))
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0)
    norms = _fuse_layer_norms(graph, view) if opset >= LAYER_NORM_OPSET else 0
    view = GraphView(graph, view.ranks)
    tensordots = _collapse_tensordots(graph, view)
    view = GraphView(graph, view.ranks)
    projections = collapse_projections(graph, view)
    if norms or tensordots or projections:
        _drop_dead_nodes(graph)
        drop_unread_initializers(graph)
    return Fusions(norms, tensordots, projections, before, len(graph.node))


def _last_axis_mean(node: Any, view: GraphView) -> str | None:
    """The input ``node`` averages over its last axis (rank 3, keepdims), or None."""
    from onnx import helper

    if not node.input or view.ranks.get(node.input[0]) != 3:
        return None
    if node.op_type == "GlobalAveragePool":  # averages over every axis after the second: the last, at rank 3
        return str(node.input[0])
    if node.op_type != "ReduceMean":
        return None
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axes = attributes.get("axes")
    if axes is None and len(node.input) > 1:  # opset 18 takes the axes as an input
        constant = view.constant(node.input[1])
        axes = None if constant is None else constant.tolist()
    if attributes.get("keepdims", 1) != 1 or axes is None or [int(a) % 3 for a in np.ravel(axes)] != [2]:
        return None
    return str(node.input[0])


def _other(node: Any, name: str) -> str | None:
    """The other input of a two-input node that reads ``name`` once."""
    inputs = list(node.input)
    if len(inputs) != 2 or inputs.count(name) != 1:
        return None
    return str(inputs[1] if inputs[0] == name else inputs[0])


def _vector(value: np.ndarray | None, width: int | None) -> np.ndarray | None:
    """A constant that broadcasts along the last axis only, as a [width] vector of its own type (the type the
    pattern computes in)."""
    if value is None or width is None or value.size not in (1, width):
        return None
    if value.ndim > 1 and any(d != 1 for d in value.shape[:-1]):
        return None
    return np.ascontiguousarray(np.broadcast_to(value.reshape(-1), (width,)))


def _fuse_layer_norms(graph: Any, view: GraphView) -> int:
    """mean = avg(x); d = x - mean; var = avg(d*d); r = 1/sqrt(var + eps); g = r*gamma;
    y = x*g + (beta + (-mean)*g)  ->  LayerNormalization(x, gamma, beta, epsilon=eps)."""
    from onnx import helper, numpy_helper

    replaced: dict[int, Any] = {}
    removed: set[int] = set()
    added_initializers = []
    for mean in graph.node:
        x = _last_axis_mean(mean, view)
        if x is None or id(mean) in removed:
            continue
        match = _layer_norm_at(mean, x, view)
        if match is None:
            continue
        output, inner, gamma, beta, epsilon = match
        base = f"{output}__layer_norm"
        added_initializers += [
            numpy_helper.from_array(gamma, f"{base}_scale"),
            numpy_helper.from_array(beta, f"{base}_bias"),
        ]
        fused = helper.make_node(
            "LayerNormalization", [x, f"{base}_scale", f"{base}_bias"], [output], name=base, axis=-1, epsilon=epsilon
        )
        replaced[id(inner[-1])] = fused
        removed.update(id(node) for node in inner)
    if replaced:
        nodes = [replaced.get(id(node), node) for node in graph.node if id(node) not in removed or id(node) in replaced]
        del graph.node[:]
        graph.node.extend(nodes)
        graph.initializer.extend(added_initializers)
    return len(replaced)


def _layer_norm_at(mean: Any, x: str, view: GraphView) -> tuple[str, list[Any], np.ndarray, np.ndarray, float] | None:
    """(output, the pattern's nodes with the last one last, gamma, beta, epsilon) of the LayerNorm whose mean is
    ``mean``, or None where the nodes compute anything else."""
    readers = view.readers(mean.output[0])
    subs = [n for n in readers if n.op_type == "Sub" and list(n.input) == [x, mean.output[0]]]
    negs = [n for n in readers if n.op_type == "Neg"]
    if len(readers) != 2 or len(subs) != 1 or len(negs) != 1:
        return None
    sub, neg = subs[0], negs[0]
    chain = _follow(view, sub.output[0], ["Mul", mean.op_type, "Add", "Sqrt", "Reciprocal", "Mul"])
    if chain is None:
        return None
    square, variance, add_eps, _, reciprocal, scale = chain
    if list(square.input) != [sub.output[0]] * 2 or _last_axis_mean(variance, view) != square.output[0]:
        return None
    eps_name, gamma_name = _other(add_eps, variance.output[0]), _other(scale, reciprocal.output[0])
    epsilon = None if eps_name is None else view.constant(eps_name)
    if epsilon is None or epsilon.size != 1 or gamma_name is None:
        return None
    scaled = view.readers(scale.output[0])
    x_scaled = [n for n in scaled if n.op_type == "Mul" and _other(n, scale.output[0]) == x]
    mean_scaled = [n for n in scaled if n.op_type == "Mul" and _other(n, scale.output[0]) == neg.output[0]]
    if len(scaled) != 2 or len(x_scaled) != 1 or len(mean_scaled) != 1:
        return None
    tail = _follow(view, mean_scaled[0].output[0], ["Add", "Add"])
    if tail is None or id(view.only_reader(neg.output[0], "Mul")) != id(mean_scaled[0]):
        return None
    shift, total = tail
    beta_name = _other(shift, mean_scaled[0].output[0])
    if beta_name is None or _other(total, shift.output[0]) != x_scaled[0].output[0]:
        return None
    if id(view.only_reader(x_scaled[0].output[0], "Add")) != id(total):
        return None
    gamma_value, beta_value = view.constant(gamma_name), view.constant(beta_name)
    widths = [int(v.shape[-1]) for v in (gamma_value, beta_value) if v is not None and v.ndim and v.shape[-1] > 1]
    width = widths[0] if widths else None
    gamma, beta = _vector(gamma_value, width), _vector(beta_value, width)
    if gamma is None or beta is None:
        return None
    return (
        str(total.output[0]),
        [mean, sub, neg, *chain, x_scaled[0], *mean_scaled, shift, total],
        gamma,
        beta,
        float(epsilon.reshape(-1)[0]),
    )


def _follow(view: GraphView, name: str, op_types: list[str]) -> list[Any] | None:
    """The nodes that read ``name`` one after another, each the only reader of the one before, of these types."""
    nodes: list[Any] = []
    for op_type in op_types:
        node = view.only_reader(name, op_type)
        if node is None:
            return None
        nodes.append(node)
        name = node.output[0]
    return nodes


def _collapse_tensordots(graph: Any, view: GraphView) -> int:
    """Reshape(x, [-1, K]) -> MatMul(., W[K, N]) -> Reshape(., Concat(Shape(x)[0..r-2], [N]))  ->  MatMul(x, W)."""
    collapsed = 0
    dropped: set[int] = set()
    for matmul in graph.node:
        if matmul.op_type != "MatMul":
            continue
        weight = view.dims(matmul.input[1])  # its shape only: a weight is not copied to be looked at
        flatten = view.producer.get(matmul.input[0])
        if weight is None or len(weight) != 2 or flatten is None or flatten.op_type != "Reshape":
            continue
        x = flatten.input[0]
        rank = view.ranks.get(x)
        flat_shape = view.constant(flatten.input[1])
        if rank is None or rank < 3 or flat_shape is None or flat_shape.tolist() != [-1, weight[0]]:
            continue
        unflatten = view.only_reader(matmul.output[0], "Reshape")
        if unflatten is None or not _leading_dims_then(unflatten.input[1], x, rank, weight[1], view):
            continue
        matmul.input[0] = x
        matmul.output[0] = unflatten.output[0]
        dropped.add(id(unflatten))
        collapsed += 1
    if dropped:
        nodes = [node for node in graph.node if id(node) not in dropped]
        del graph.node[:]
        graph.node.extend(nodes)
    return collapsed


def _leading_dims_then(shape: str, x: str, rank: int, columns: int, view: GraphView) -> bool:
    """Whether ``shape`` is x's dimensions 0..rank-2 followed by ``columns`` (tf2onnx's Tensordot: Concat of a
    Gather from Shape(x), through Casts between int32 and int64, and a constant)."""
    node = through_casts(shape, view)
    if node is None or node.op_type != "Concat" or len(node.input) != 2:
        return False
    last = view.constant(node.input[1])
    if last is None or last.reshape(-1).tolist() != [columns]:
        return False
    return shape_indices(node.input[0], x, view) == list(range(rank - 1))


def _drop_dead_nodes(graph: Any) -> None:
    """Nodes none of whose outputs is read (by a node, a subgraph or as a graph output) go, until none is left."""
    outputs = {value.name for value in graph.output}
    while True:
        read = names_read_by(graph.node) | outputs
        live = [node for node in graph.node if any(name in read for name in node.output if name)]
        if len(live) == len(graph.node):
            return
        del graph.node[:]
        graph.node.extend(live)
