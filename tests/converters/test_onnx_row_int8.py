"""Per-row int8 products: onnxruntime computes exactly the numpy simulation the smoothing chooses by (each row
symmetric int8 by its own peak, weights per output channel), a massive row costs the other rows nothing, the row
ranges are taken once per input tensor, and a kept node goes back to its float MatMul."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pe_export.converters.onnx.quantize import QuantizedVariants, _quantize, _run
from pe_export.converters.onnx.row_int8 import LEVELS, row_int8_matmuls, row_quantized
from pe_export.converters.search.smoothing import per_channel_int8
from tests.helpers import SATURATES, int8_kernel_saturates, matmul_model, onnx_model

K, N = 72, 24


@pytest.fixture(autouse=True)
def _vnni_or_arm() -> None:
    if int8_kernel_saturates():
        pytest.skip(SATURATES)


def relative_row_errors(y: np.ndarray, exact: np.ndarray) -> np.ndarray:
    return np.linalg.norm(y - exact, axis=1) / np.linalg.norm(exact, axis=1)


def test_onnxruntime_computes_the_simulation_and_a_massive_row_costs_the_others_nothing() -> None:
    rng = np.random.default_rng(1)
    weight = rng.normal(size=(K, N)).astype(np.float32)
    x = rng.normal(size=(6, K)).astype(np.float32)
    x[0] *= 200.0  # a [CLS]-like row of massive activations
    x[3] = 0.0  # a padded row: exactly zero, and finite
    model = matmul_model(weight)
    assert row_int8_matmuls(model, set()) == 1
    onnx.checker.check_model(model)
    assert not [init for init in model.graph.initializer if init.name == "W"]  # the float weight is dropped
    (got,) = _run(model, [{"x": x}])
    simulated = row_quantized(x.astype(np.float64)) @ per_channel_int8(weight.astype(np.float64), LEVELS)
    np.testing.assert_allclose(got["y"], simulated, rtol=1e-5, atol=1e-4 * np.abs(simulated).max())
    assert not got["y"][3].any()
    exact = x.astype(np.float64) @ weight.astype(np.float64)
    (per_call,) = _run(_quantize(matmul_model(weight), [], "matmulinteger"), [{"x": x}])
    rows = [0, 1, 2, 4, 5]
    assert relative_row_errors(got["y"][rows], exact[rows]).max() < 0.02
    assert (
        relative_row_errors(got["y"][1:3], exact[1:3]).max() * 10
        < relative_row_errors(per_call["y"][1:3], exact[1:3]).max()
    )


def two_readers() -> onnx.ModelProto:
    """y = x·W1 and z = x·W2: one input, two products (a layer's query and key)."""
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array(rng.normal(size=(K, width)).astype(np.float32), name)
        for name, width in (("W1", N), ("W2", 8))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["y"], name="first"),
        helper.make_node("MatMul", ["x", "W2"], ["z"], name="second"),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, d]) for n, d in (("y", N), ("z", 8))]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, K])], outputs, initializer=inits
    )
    return onnx_model(graph)


def test_the_rows_are_quantized_once_per_input_and_a_kept_node_goes_back_to_float() -> None:
    model = two_readers()
    x = np.random.default_rng(3).normal(size=(5, K)).astype(np.float32)
    (exact,) = _run(model, [{"x": x}])
    quantized = _quantize(model, [], "rows")
    ops = [node.op_type for node in quantized.graph.node]
    assert ops.count("QuantizeLinear") == ops.count("ReduceMax") == 1 and ops.count("MatMulIntegerToFloat") == 2
    kept = QuantizedVariants(model, quantized).build(["first"])
    ops = [node.op_type for node in kept.graph.node]
    assert ops.count("MatMul") == 1 and ops.count("MatMulIntegerToFloat") == 1 and ops.count("QuantizeLinear") == 1
    (got,) = _run(kept, [{"x": x}])
    w1 = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "W1"))
    np.testing.assert_allclose(got["y"], x @ w1.astype(np.float16).astype(np.float32), rtol=1e-4, atol=1e-4)
    assert 0 < relative_row_errors(got["z"], exact["z"]).max() < 0.02  # the other product still int8
    excluded = _quantize(model, ["second"], "rows")
    assert [node.name for node in excluded.graph.node if node.op_type == "MatMul"] == ["second"]
