"""The rank of each tensor of an ONNX graph, where tf2onnx's shape arithmetic hides it from shape inference.

ONNX shape inference loses a tensor's rank at the first op whose output shape is computed (an Expand by a shape
built from Shape, Slice and Concat: keras-hub's position embedding broadcast), and every elementwise op after it
inherits the loss. Which fusion is sound depends on ranks (a GlobalAveragePool is a last-axis mean only at rank
3), so they are carried on here: a computed shape's length from the ops that build it, and a tensor's rank
through the ops an encoder is made of. Unknown stays unknown: nothing is guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Constant = Callable[[str], "np.ndarray | None"]


# Ops whose output has the rank of their (broadcast) inputs: where shape inference loses a rank (an Expand by a
# computed shape), it is carried through these (GlobalAveragePool keeps its input's rank).
_ELEMENTWISE = {
    "GlobalAveragePool",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Where",
    "Neg",
    "Sqrt",
    "Reciprocal",
    "Cast",
    "Erf",
    "Tanh",
    "Relu",
    "Sigmoid",
    "Softmax",
    "Identity",
    "Abs",
    "Exp",
    "Log",
    "LayerNormalization",
    "Max",
    "Min",
    "Not",
    "Equal",
    "Less",
    "Greater",
}


def tensor_ranks(model: Any) -> dict[str, int]:
    """Each tensor's rank where it is known: shape inference on the graph without its weights (initializers
    declared as inputs of their shape: the file's bytes are not copied), then carried through elementwise ops and
    Expand (its output's rank: its input's or its shape's length, the larger) where inference lost it."""
    from onnx import helper, shape_inference

    graph = model.graph
    declared = {value.name for value in graph.input}
    weights = [
        helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
        for init in graph.initializer
        if init.name not in declared
    ]
    skeleton = helper.make_graph(list(graph.node), "skeleton", [*graph.input, *weights], list(graph.output))
    skeleton_model = helper.make_model(skeleton, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    try:
        inferred = shape_inference.infer_shapes(skeleton_model, strict_mode=False).graph
    except Exception:  # shape inference refusing a node means no rank is known: nothing is fused
        return {}
    shapes: dict[str, list[int]] = {}
    for value in [*inferred.input, *inferred.value_info, *inferred.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            shapes[value.name] = [dim.dim_value if dim.HasField("dim_value") else -1 for dim in tensor.shape.dim]
    ranks = {name: len(dims) for name, dims in shapes.items()}
    lengths = {name: dims[0] for name, dims in shapes.items() if len(dims) == 1 and dims[0] >= 0}
    constant = _constants(graph)
    for node in graph.node:  # topological order, as ONNX requires
        if not node.output:
            continue
        length = _shape_length(node, ranks, lengths, constant)
        if length is not None:
            lengths.setdefault(node.output[0], length)
            ranks.setdefault(node.output[0], 1)
        if node.output[0] in ranks:
            continue
        rank = _rank_of(node, ranks, lengths, constant)
        if rank is not None:
            for output in node.output if node.op_type in _SAME_RANK_OUTPUTS else node.output[:1]:
                ranks.setdefault(output, rank)
    return ranks


_SAME_RANK_OUTPUTS = {"Split"}


def _rank_of(node: Any, ranks: dict[str, int], lengths: dict[str, int], constant: Constant) -> int | None:
    """The rank of ``node``'s (first) output from its inputs' ranks, for the ops an encoder's graph is made of."""
    from onnx import helper

    op, inputs = node.op_type, [name for name in node.input if name]
    known = [ranks.get(name) for name in inputs]
    first = known[0] if known else None
    if op in _ELEMENTWISE and known and all(rank is not None for rank in known):
        return max(rank for rank in known if rank is not None)
    if op in ("Transpose", "Slice", "Split", "Concat") and first is not None:
        return first
    if op == "Expand" and first is not None and inputs[1] in lengths:
        return max(first, lengths[inputs[1]])
    if op == "Reshape" and inputs[1] in lengths:
        return lengths[inputs[1]]
    ints = [rank for rank in known if rank is not None]
    if op == "MatMul" and len(ints) == 2 and min(ints) >= 2:
        return max(ints)
    if op == "Gemm":
        return 2
    if op == "Gather" and len(ints) == 2 == len(known):
        return ints[0] - 1 + ints[1]
    if op in ("Squeeze", "Unsqueeze") and first is not None:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axes = attributes.get("axes")
        if axes is None and len(inputs) > 1:
            given = constant(inputs[1])
            axes = None if given is None else given.reshape(-1).tolist()
        if axes is not None:
            return first + len(axes) if op == "Unsqueeze" else first - len(axes)
    return None


def _shape_length(node: Any, ranks: dict[str, int], lengths: dict[str, int], constant: Constant) -> int | None:
    """How many values a computed shape (a 1-D integer tensor) holds, where its node says: a Shape, a Cast or
    Concat of such, a Slice or Gather of one by constants."""
    op, inputs = node.op_type, list(node.input)
    if op == "Shape" and not node.attribute and inputs[0] in ranks:
        return ranks[inputs[0]]
    if op == "Cast" and inputs[0] in lengths:
        return lengths[inputs[0]]
    if op == "Concat" and all(name in lengths for name in inputs):
        return sum(lengths[name] for name in inputs)
    if op == "Gather" and ranks.get(inputs[0]) == 1:
        indices = constant(inputs[1])
        return None if indices is None or indices.ndim != 1 else int(indices.size)
    if op == "Slice" and inputs[0] in lengths and len(inputs) >= 3:
        bounds = [constant(name) for name in inputs[1:]]
        if any(bound is None or bound.size != 1 for bound in bounds):
            return None
        starts, ends, *rest = (int(bound.reshape(-1)[0]) for bound in bounds if bound is not None)
        step = rest[1] if len(rest) > 1 else 1
        return len(range(lengths[inputs[0]])[starts:ends:step])
    return None


def _constants(graph: Any) -> Constant:
    """The value of an initializer or a Constant node's output by name, else None."""
    from onnx import numpy_helper

    initializers = {init.name: init for init in graph.initializer}
    constants = {
        node.output[0]: node.attribute[0].t
        for node in graph.node
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value"
    }

    def value(name: str) -> np.ndarray | None:
        tensor = initializers.get(name)
        if tensor is None:
            tensor = constants.get(name)
        return None if tensor is None else np.asarray(numpy_helper.to_array(tensor))

    return value
