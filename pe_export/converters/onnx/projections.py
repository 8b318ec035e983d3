"""tf2onnx's einsum projections written as one MatMul on the 3-D input.

Keras's attention projects with EinsumDense (``abc,cde->abde`` for the query, key and value, ``abcd,cde->abe``
for the output). tf2onnx lowers each einsum to a 2-D Gemm between shape arithmetic: the input Unsqueezed or
Transposed to rank 5, Reshaped to [-1, K], the Gemm, then Reshaped back by a shape Concat-ed from a Gather of the
input's Shape and constants, and Squeezed: on all-MiniLM-L6-v2 about 20 small nodes per layer beside its four
products, each a dispatch onnxruntime pays on every call. The same product is ``MatMul(x, W)`` on the input's
leading dimensions, with a Reshape by constant dimensions where the projection splits its columns into heads.

Decided from what the nodes compute: the Gemm multiplies by a constant (alpha 1, A not transposed, no bias),
its input is Reshape(s, [-1, K]), its only reader Reshapes it to s's own leading dimensions (a Gather of Shape(s)
at 0..j-1) followed by constants whose product is the Gemm's N columns, and a Squeeze after it removes only
dimensions of 1 among those constants. That Reshape succeeds only where s's rows are those leading dimensions
(rows · N = leading · N), so ``Reshape(s, [0, …, 0, -1])`` is [leading…, K] with the rows in the same order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pe_export.converters.onnx.graph_view import GraphView


def collapse_projections(graph: Any, view: GraphView) -> int:
    """In place: each einsum projection as ``MatMul(x, W[K, N])`` (and a Reshape by constant dimensions where
    its output has more than one after the leading ones), writing the pattern's output under its old name; the
    shape nodes it leaves unread are for the caller to drop. Returns how many."""
    from onnx import helper, numpy_helper

    replaced: dict[int, list[Any]] = {}
    removed: set[int] = set()
    names = {node.name for node in graph.node}
    weights: dict[tuple[str, bool], str] = {}
    for gemm in graph.node:
        match = _projection_at(gemm, view) if gemm.op_type == "Gemm" else None
        if match is None:
            continue
        x, leading, tail, output, pattern, weight, transposed = match
        key = (gemm.input[1], transposed)
        if key not in weights:
            weights[key] = _stored_as_matmul_weight(graph, view, gemm.input[1], weight, transposed)
        name = _name_for(gemm, output, view, names)
        nodes = []
        if x is None:  # the input only reaches rank 3 through the pattern's own reshaping: say so with zeros
            x = f"{name}/input"
            shape = numpy_helper.from_array(np.array([0] * leading + [-1], np.int64), f"{name}/input_shape")
            graph.initializer.append(shape)
            nodes.append(helper.make_node("Reshape", [pattern[0].input[0], shape.name], [x], name=f"{name}/Reshape"))
        if len(tail) == 1:
            nodes.append(helper.make_node("MatMul", [x, weights[key]], [output], name=name))
        else:
            product = f"{name}:0"
            heads = numpy_helper.from_array(np.array([0] * leading + tail, np.int64), f"{name}/heads_shape")
            graph.initializer.append(heads)
            nodes.append(helper.make_node("MatMul", [x, weights[key]], [product], name=name))
            nodes.append(helper.make_node("Reshape", [product, heads.name], [output], name=f"{name}/heads"))
        replaced[id(gemm)] = nodes
        removed.update(id(node) for node in pattern[1:] if node is not gemm)
    if replaced:
        kept = []
        for node in graph.node:
            if id(node) in replaced:
                kept.extend(replaced[id(node)])
            elif id(node) not in removed:
                kept.append(node)
        del graph.node[:]
        graph.node.extend(kept)
    return len(replaced)


def _stored_as_matmul_weight(graph: Any, view: GraphView, source: str, weight: np.ndarray, transposed: bool) -> str:
    """The name of an initializer holding ``weight`` as MatMul reads it, [K, N]: the Gemm's own where it already
    is, rewritten where it lies where the Gemm is its only reader (no second copy: BERT-large's export peaked
    0.3 GB higher with 96 new 4 MB initializers beside the old ones), else a new one."""
    from onnx import numpy_helper

    if source in view.initializer_names and not transposed:
        return source
    if source in view.initializer_names and len(view.consumers.get(source, [])) == 1:
        initializer = view.initializer(source)
        initializer.ClearField("float_data")
        initializer.raw_data = np.ascontiguousarray(weight).tobytes()
        del initializer.dims[:]
        initializer.dims.extend(weight.shape)
        return source
    stored = f"{source}__kn"
    graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight), stored))
    return stored


def _projection_at(
    gemm: Any, view: GraphView
) -> tuple[str | None, int, list[int], str, list[Any], np.ndarray, bool] | None:
    """(the rank-3 input or None, how many leading dimensions, the constant dimensions after them, the
    pattern's output, its nodes [flatten, gemm, unflatten, squeeze?], W as [K, N], whether W is stored
    transposed) of the einsum projection whose product is ``gemm``, or None where it computes anything else."""
    from onnx import helper

    attributes = {a.name: helper.get_attribute_value(a) for a in gemm.attribute}
    has_bias = len(gemm.input) > 2 and bool(gemm.input[2])
    if attributes.get("alpha", 1.0) != 1.0 or attributes.get("transA", 0) or has_bias:
        return None
    value = view.constant_value(gemm.input[1])
    if value is None or value.ndim != 2 or value.dtype != np.float32:
        return None
    transposed = bool(attributes.get("transB", 0))
    weight = value.T if transposed else value
    columns = int(weight.shape[1])
    flatten = view.producer.get(gemm.input[0])
    if flatten is None or flatten.op_type != "Reshape":
        return None
    source = flatten.input[0]
    if not _rows_by(flatten.input[1], source, int(weight.shape[0]), view):
        return None
    unflatten = view.only_reader(gemm.output[0], "Reshape")
    if unflatten is None:
        return None
    split = _leading_then_constants(unflatten.input[1], source, view)
    if split is None:
        return None
    leading, tail = split
    if leading < 1 or int(np.prod(tail)) != columns:
        return None
    pattern, output = [flatten, gemm, unflatten], str(unflatten.output[0])
    squeeze = view.only_reader(output, "Squeeze")
    if squeeze is not None:
        axes = _squeeze_axes(squeeze, view)
        if axes is None or any(a < leading or a >= leading + len(tail) or tail[a - leading] != 1 for a in axes):
            return None
        tail = [d for i, d in enumerate(tail) if i + leading not in axes]
        pattern.append(squeeze)
        output = str(squeeze.output[0])
    return _rank3_input(source, leading, view), leading, tail, output, pattern, weight, transposed


def _rows_by(shape: str, source: str, inner: int, view: GraphView) -> bool:
    """Whether ``shape`` is [-1, inner]: a constant, or tf2onnx's Concat([-1], ReduceProd(Gather(Shape(source),
    its trailing axes))), which the Gemm reading the result only runs with where that product is ``inner``."""
    from pe_export.converters.onnx.graph_view import shape_indices, through_casts

    constant = view.constant_value(shape)
    if constant is not None:
        return bool(constant.reshape(-1).tolist() == [-1, inner])
    concat = through_casts(shape, view)
    if concat is None or concat.op_type != "Concat" or len(concat.input) != 2:
        return False
    first, product = view.constant_value(concat.input[0]), through_casts(concat.input[1], view)
    if first is None or first.reshape(-1).tolist() != [-1] or product is None or product.op_type != "ReduceProd":
        return False
    rank, axes = view.ranks.get(source), shape_indices(product.input[0], source, view)
    if rank is None or not axes:
        return False
    return axes == list(range(rank - len(axes), rank))


def _leading_then_constants(shape: str, source: str, view: GraphView) -> tuple[int, list[int]] | None:
    """(j, tail) where ``shape`` is Concat(Gather(Shape(source), [0..j-1]), constants…), or None."""
    from pe_export.converters.onnx.graph_view import shape_indices, through_casts

    concat = through_casts(shape, view)
    if concat is None or concat.op_type != "Concat" or len(concat.input) < 2:
        return None
    indices = shape_indices(concat.input[0], source, view)
    if not indices or indices != list(range(len(indices))):
        return None
    tail: list[int] = []
    for name in concat.input[1:]:
        part = view.constant_value(name)
        if part is None or part.dtype.kind not in "iu" or (part.size and part.min() < 1):
            return None
        tail += [int(d) for d in part.reshape(-1)]
    return len(indices), tail


def _squeeze_axes(squeeze: Any, view: GraphView) -> list[int] | None:
    from onnx import helper

    attributes = {a.name: helper.get_attribute_value(a) for a in squeeze.attribute}
    axes = attributes.get("axes")
    if axes is None and len(squeeze.input) > 1:  # opset 13 takes the axes as an input
        constant = view.constant_value(squeeze.input[1])
        axes = None if constant is None else constant.reshape(-1).tolist()
    if axes is None or any(int(a) < 0 for a in axes):
        return None
    return [int(a) for a in axes]


def _rank3_input(source: str, leading: int, view: GraphView) -> str | None:
    """The tensor ``source`` Unsqueezes by size-1 axes after its ``leading`` ones, where it is of rank leading + 1
    (then it is already [leading…, K]); None otherwise (the caller reshapes ``source``)."""
    node = view.producer.get(source)
    if node is None or node.op_type != "Unsqueeze" or view.ranks.get(node.input[0]) != leading + 1:
        return None
    axes = _squeeze_axes(node, view)  # Unsqueeze takes its axes as Squeeze does
    if axes is None or any(a < leading for a in axes):
        return None
    return str(node.input[0])


def _name_for(gemm: Any, output: str, view: GraphView, names: set[str]) -> str:
    """The MatMul's name: the layer path of the bias Add that reads it (tf2onnx names its Gemms by a counter),
    or the Gemm's own."""
    readers = view.readers(output)
    if len(readers) == 1 and readers[0].op_type == "Add" and "/" in readers[0].name:
        candidate = readers[0].name.rsplit("/", 1)[0] + "/MatMul"
        if candidate not in names:
            names.add(candidate)
            return candidate
    return str(gemm.name)
