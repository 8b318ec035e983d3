"""ONNX graph clean-ups after tf2onnx that make the file smaller without changing what it computes.

tf2onnx lowers Keras's attention einsums with a Shape of the folded weight: the weight is
stored once for the MatMul (as [512, 512]) and once more, in another layout, only so that a
Shape node can read its dimensions. Those dimensions are known when the file is written, so
the Shape becomes a constant and the copy goes: 6.3 MB (19%) of a d=512, 2-block encoder.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
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
    size = sum(int(np.prod(init.dims, dtype=np.int64)) * _itemsize(init.data_type) for init in dropped)
    count = len(dropped)
    remove_initializers(graph, {init.name for init in dropped})
    return ShapeFolding(folded, count, size)


def remove_initializers(graph: Any, names: set[str]) -> None:
    """In place: the named initializers go, the rest stay where they are. Clearing the field and extending it
    with the kept ones copies every kept weight (protobuf's extend copies): BERT-base's 440 MB once more."""
    if not names:
        return
    for index in range(len(graph.initializer) - 1, -1, -1):
        if graph.initializer[index].name in names:
            del graph.initializer[index]


def _names_read(graph: Any) -> set[str]:
    """Every tensor name a node reads, in this graph and in the subgraphs of If/Loop/Scan nodes."""
    return names_read_by(graph.node)


def names_read_by(nodes: Any) -> set[str]:
    from onnx import AttributeProto

    names: set[str] = set()
    for node in nodes:
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


def gemms_to_matmuls(model: Any) -> int:
    """In place: every ``Gemm(A, W)`` with a constant W (alpha 1, A not transposed) becomes ``MatMul(A, W')``
    (then ``Add(C)`` where it has a bias), the same arithmetic; returns how many.

    tf2onnx lowers Keras's attention einsums to Gemm, and onnxruntime's dynamic quantizer has integer
    kernels for MatMul only: on all-MiniLM-L6-v2 the 24 attention projections stayed float32 until this.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    nodes, count = [], 0
    for node in graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        has_bias = len(node.input) > 2 and bool(node.input[2])
        if (
            node.op_type != "Gemm"
            or node.input[1] not in initializers
            or attributes.get("transA", 0)
            or attributes.get("alpha", 1.0) != 1.0
            or (has_bias and attributes.get("beta", 1.0) != 1.0)
        ):
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(initializers[node.input[1]])
        if attributes.get("transB", 0):
            weight = weight.T
        weight_name = f"{node.input[1]}__for_{node.name}"
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight), weight_name))
        product = f"{node.output[0]}__matmul" if has_bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], weight_name], [product], name=f"{node.name}__matmul"))
        if has_bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}__bias"))
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(nodes)
        drop_unread_initializers(graph)
    return count


FLOAT16_MAX = 65504.0


def float16_stored(initializer: Any) -> tuple[Any, Any] | None:
    """A float32 weight stored in float16 and cast back on load, onnxruntime folding the Cast when it builds a
    session: (the float16 initializer, the Cast that writes the original name). None where float16 cannot hold
    a value of it (beyond its range)."""
    from onnx import TensorProto, helper, numpy_helper

    values = numpy_helper.to_array(initializer)
    if values.size and float(np.abs(values).max()) > FLOAT16_MAX:
        return None
    half = numpy_helper.from_array(values.astype(np.float16), f"{initializer.name}__fp16")
    cast = helper.make_node(
        "Cast", [half.name], [initializer.name], name=f"{initializer.name}__to_fp32", to=TensorProto.FLOAT
    )
    return half, cast


def drop_unread_initializers(graph: Any) -> None:
    """Initializers no node (or subgraph) reads and that are not graph outputs or listed inputs go."""
    used = _names_read(graph) | {value.name for value in graph.output} | {value.name for value in graph.input}
    remove_initializers(graph, {init.name for init in graph.initializer if init.name not in used})


def rebuild_tables_at_load(model: Any, zero_node: str) -> int:
    """Make each compressed table's rebuild depend on constants only, so that onnxruntime folds it once
    when it creates the session (in memory; the file keeps the small stored arrays) instead of rebuilding
    it on every call. ``zero_node`` is the node that computes the run-time zero (always 0) the rebuild
    reads, there to stop tf2onnx and pe-export's own optimisation passes from folding the table back into
    the file: this runs after them, as the export's last rewrite. Returns how many zeros were replaced.

    A runtime that does not fold constants (optimisations off) still computes the same table each call.
    """
    from onnx import TensorProto, helper

    graph = model.graph
    producers = [node for node in graph.node if node.name == zero_node and len(node.output) == 1]
    for node in producers:
        graph.initializer.append(helper.make_tensor(node.output[0], TensorProto.INT32, [], [0]))
    if not producers:
        return 0
    drop = {id(node) for node in producers}
    kept = [node for node in graph.node if id(node) not in drop]
    outputs = {value.name for value in graph.output}
    while True:  # the zero's own inputs (a reduction over a graph input) are read by nothing else now
        read = names_read_by(kept) | outputs
        live = [node for node in kept if any(name in read for name in node.output)]
        if len(live) == len(kept):
            break
        kept = live
    del graph.node[:]
    graph.node.extend(kept)
    drop_unread_initializers(graph)
    return len(producers)


def folded_by_onnxruntime(model: bytes | str) -> Any:
    """The model (its bytes or a path) as onnxruntime's basic optimizer leaves it: constants folded (tf2onnx leaves
    some kernels behind a Reshape of a constant), the same arithmetic."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="pe-export-") as work:
        folded = Path(work) / "folded.onnx"
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
        return onnx.load(str(folded))
