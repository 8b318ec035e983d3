"""Ranks carried past where ONNX shape inference loses them (an Expand by a computed shape), never guessed."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from pe_export.converters.onnx.ranks import tensor_ranks
from tests.helpers import onnx_model


def expand_graph() -> object:
    """keras-hub's position embedding: table[:T] broadcast to [B, T, D] by a shape built from Shape(ids), then
    added to the token embedding and scaled; ``opaque`` is reshaped by a shape read from an input."""
    table = numpy_helper.from_array(np.zeros((16, 4), np.float32), "table")
    nodes = [
        helper.make_node("Gather", ["vocab", "ids"], ["tokens"], axis=0),  # [B, T, 4]
        helper.make_node("Shape", ["ids"], ["ids_shape"]),
        helper.make_node("Cast", ["ids_shape"], ["shape32"], to=TensorProto.INT32),  # tf2onnx's int32 shapes
        helper.make_node("Slice", ["shape32", "one", "two"], ["length32"]),  # [T]
        helper.make_node("Cast", ["length32"], ["length"], to=TensorProto.INT64),
        helper.make_node("Slice", ["table", "zero", "length"], ["rows"]),  # [T, 4]
        helper.make_node("Slice", ["shape32", "zero32", "one"], ["batch32"]),  # [B]
        helper.make_node("Concat", ["batch32", "length32", "width"], ["target32"], axis=0),  # [B, T, 4]
        helper.make_node("Cast", ["target32"], ["target"], to=TensorProto.INT64),
        helper.make_node("Expand", ["rows", "target"], ["positions"]),
        helper.make_node("Add", ["tokens", "positions"], ["summed"]),
        helper.make_node("Mul", ["summed", "half"], ["scaled"]),
        helper.make_node("Reshape", ["scaled", "new_shape"], ["opaque"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [None, None]),
            helper.make_tensor_value_info("new_shape", TensorProto.INT64, [None]),
        ],
        [helper.make_tensor_value_info("opaque", TensorProto.FLOAT, None)],
        initializer=[
            table,
            numpy_helper.from_array(np.zeros((10, 4), np.float32), "vocab"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            *(numpy_helper.from_array(np.array([v], np.int32), n) for n, v in (("zero32", 0), ("one", 1), ("two", 2))),
            numpy_helper.from_array(np.array([4], np.int32), "width"),
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        ],
    )
    return onnx_model(graph)


def test_rank_is_carried_through_a_computed_expand_and_what_follows() -> None:
    """Shape inference runs on the graph without its initializers' values (the weights are not copied), so the
    Slices of the shape have no known length there; the shape's length is carried from Shape, Slice and Concat."""
    ranks = tensor_ranks(expand_graph())
    assert (ranks["target"], ranks["positions"], ranks["summed"], ranks["scaled"]) == (1, 3, 3, 3)


def test_a_shape_from_an_input_leaves_the_rank_unknown() -> None:
    assert "opaque" not in tensor_ranks(expand_graph())
