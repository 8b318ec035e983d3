"""Outlier channels beside the int8 product: the split graph computes what the MatMul did (in float), the side
product is never quantized, and the channels chosen are the ones that stand out."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from pe_export.converters.onnx.outliers import add_outlier_paths, is_side_node
from pe_export.converters.onnx.quantize import _quantize, _run, quantizable_nodes
from pe_export.converters.search.smoothing import outlier_channels
from tests.helpers import SATURATES, int8_kernel_saturates, matmul_model


def split(model: onnx.ModelProto, channels: list[int]) -> onnx.ModelProto:
    """``model``'s MatMul reading x with ``channels`` zeroed (as smoothing's Mul does) plus the side product."""
    weight = numpy_helper.to_array(model.graph.initializer[0])
    width = weight.shape[0]
    mask = np.ones(width, np.float32)
    mask[channels] = 0.0
    zeroed = weight.copy()
    zeroed[channels] = 0.0
    graph = model.graph
    graph.initializer.extend([numpy_helper.from_array(mask, "mask"), numpy_helper.from_array(zeroed, "W_rest")])
    node = graph.node[0]
    node.input[0], node.input[1] = "x_masked", "W_rest"
    graph.node.insert(0, helper.make_node("Mul", ["x", "mask"], ["x_masked"], name="mask"))
    add_outlier_paths(graph, node, np.array(channels), "x", weight)
    return model


def test_the_split_computes_the_same_product_and_its_side_stays_float() -> None:
    if int8_kernel_saturates():
        pytest.skip(SATURATES)
    rng = np.random.default_rng(3)
    weight = rng.normal(size=(16, 8)).astype(np.float32)
    x = rng.normal(size=(5, 16)).astype(np.float32)
    x[:, 7] *= 50.0
    model = split(matmul_model(weight), [7, 2])
    onnx.checker.check_model(model, full_check=True)
    side = [node for node in model.graph.node if is_side_node(node.name)]
    assert [node.op_type for node in side] == ["Gather", "MatMul", "Add"]
    assert model.graph.output[0].name == "y" and side[-1].output[0] == "y"
    (got,) = _run(model, [{"x": x}])
    np.testing.assert_allclose(got["y"], x.astype(np.float64) @ weight.astype(np.float64), rtol=1e-5, atol=1e-4)
    # the quantizer sees the masked MatMul only; the side product keeps its float weight rows
    assert quantizable_nodes(model) == ["product"]
    quantized = _quantize(model, [node.name for node in side])
    ops = {node.name: node.op_type for node in quantized.graph.node}
    assert ops[side[1].name] == "MatMul" and "MatMulInteger" in ops.values()
    (int8,) = _run(quantized, [{"x": x}])
    (plain,) = _run(_quantize(matmul_model(weight), []), [{"x": x}])
    exact = x.astype(np.float64) @ weight.astype(np.float64)
    split_error, plain_error = (float(np.abs(got["y"] - exact).max()) for got in (int8, plain))
    print(f"int8 max abs error: one range over the outlier {plain_error:.4f}, outlier beside it {split_error:.4f}")
    # the activations' one range spans the other 14 channels only (~50x finer steps than with channel 7); what
    # is left is mostly the weights' int8
    assert split_error < 0.2 * plain_error, (split_error, plain_error)


def test_outlier_channels_are_the_few_that_stand_out() -> None:
    even = np.linspace(1.0, 1.5, 32)
    assert outlier_channels(even, 2).size == 0  # none stands out
    one = even.copy()
    one[11] = 30.0
    assert outlier_channels(one, 2).tolist() == [11]  # the second largest is not 4x the median
    three = even.copy()
    three[[4, 20, 9]] = [10.0, 40.0, 20.0]
    assert outlier_channels(three, 2).tolist() == [9, 20]  # the two largest, ascending
    assert outlier_channels(three, 0).size == 0
    assert outlier_channels(three, 8).tolist() == [4, 9, 20]
    close = even.copy()
    close[3] = 3.5 * float(np.median(even))
    assert outlier_channels(close, 2).size == 0  # below OUTLIER_RATIO
