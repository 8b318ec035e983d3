"""Activation smoothing: the same float outputs, and a dynamic int8 error that falls where one activation
channel carries outliers (as trained encoders' LayerNorm outputs do), measured in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pe_export.converters.onnx.quantize import _quantize, _run
from pe_export.converters.onnx.row_int8 import row_quantized
from pe_export.converters.onnx.smooth import smooth_activations
from tests.helpers import SATURATES, int8_kernel_saturates, onnx_model, outlier_feeds


def outlier_model() -> onnx.ModelProto:
    """y = x·W1, z = x·W2 (two readers of one activation), u = relu(y)·W3."""
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)
        for name, shape in (("W1", (32, 24)), ("W2", (32, 8)), ("W3", (24, 16)))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["y"], name="first"),
        helper.make_node("MatMul", ["x", "W2"], ["z"], name="second"),
        helper.make_node("Relu", ["y"], ["r"]),
        helper.make_node("MatMul", ["r", "W3"], ["u"], name="third"),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, d]) for n, d in (("z", 8), ("u", 16))]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 32])], outputs, initializer=inits
    )
    return onnx_model(graph)


def feeds(seed: int) -> list[dict[str, np.ndarray]]:
    return outlier_feeds(seed, width=32)


def relative_error(
    model: onnx.ModelProto, reference: list[dict[str, np.ndarray]], inputs: list[dict[str, np.ndarray]]
) -> float:
    got = _run(model, inputs)
    error = sum(float(np.square(g[k] - r[k]).sum()) for g, r in zip(got, reference, strict=True) for k in r)
    return error / sum(float(np.square(r[k]).sum()) for r in reference for k in r)


def test_smoothing_keeps_the_float_outputs_and_cuts_the_int8_error() -> None:
    if int8_kernel_saturates():
        pytest.skip(SATURATES)
    model = outlier_model()
    calibration, held_out = feeds(6), feeds(7)
    smoothed, smoothing, outputs = smooth_activations(model, calibration, _run)
    onnx.checker.check_model(smoothed, full_check=True)
    # the model's outputs came from the capture runs: what a plain run of it gives
    for got, want in zip(outputs, _run(model, calibration), strict=True):
        assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    reference = _run(model, held_out)
    for got, want in zip(_run(smoothed, held_out), reference, strict=True):
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    assert smoothing.tensors == 2 and smoothing.smoothed >= 1  # x (read twice, one Mul) and relu(y)
    assert [n.op_type for n in smoothed.graph.node].count("Mul") == smoothing.smoothed
    assert smoothing.error_after < smoothing.error_before
    plain = relative_error(_quantize(model, []), reference, held_out)
    smooth = relative_error(_quantize(smoothed, []), reference, held_out)
    print(f"int8 relative error on held-out inputs: plain {plain:.3e}, smoothed {smooth:.3e}; {smoothing.note()}")
    assert smooth < 0.5 * plain


def test_nothing_to_smooth_without_a_constant_matmul() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
    )
    model = onnx_model(graph)
    smoothed, smoothing, outputs = smooth_activations(model, [{"x": np.ones((2, 4), np.float32)}], _run)
    assert (smoothing.tensors, smoothing.smoothed) == (0, 0) and len(smoothed.graph.node) == 1
    assert [list(o) for o in outputs] == [["y"]]


def test_outlier_channels_leave_the_int8_products_and_the_float_outputs_stay() -> None:
    """x's channel 3 (60x the others) is split off both of x's MatMuls: the float model computes what it did,
    the side products stay float, and the int8 file errs less on held-out inputs than smoothing alone."""
    model = outlier_model()
    calibration, held_out = feeds(6), feeds(7)
    smoothed = smooth_activations(model, calibration, _run)[0]
    split, split_smoothing = smooth_activations(model, calibration, _run, outliers_per_input=2)[:2]
    onnx.checker.check_model(split, full_check=True)
    assert (split_smoothing.outlier_tensors, split_smoothing.outlier_channels) == (1, 1)  # x's channel 3 only
    assert split_smoothing.outlier_bytes == (24 + 8) * 4  # its rows of W1 and W2, float32
    assert len(split_smoothing.beside) == 2 * 3 and "outlier channels" in split_smoothing.note()
    gathers = [n for n in split.graph.node if n.name in split_smoothing.beside and n.op_type == "Gather"]
    assert [
        numpy_helper.to_array(next(i for i in split.graph.initializer if i.name == g.input[1])).tolist()
        for g in gathers
    ] == [[3], [3]]
    reference = _run(model, held_out)
    for got, want in zip(_run(split, held_out), reference, strict=True):
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    quantized = _quantize(split, list(split_smoothing.beside))
    side_ops = {n.op_type for n in quantized.graph.node if n.name in split_smoothing.beside}
    assert side_ops == {"Gather", "MatMul", "Add"}  # float: the quantizer left them alone
    smooth = relative_error(_quantize(smoothed, []), reference, held_out)
    beside = relative_error(quantized, reference, held_out)
    print(f"int8 relative error on held-out inputs: smoothed {smooth:.3e}, outliers beside {beside:.3e}")
    assert beside < 0.6 * smooth  # measured 0.45x: smoothing had already moved much of channel 3 into W1, W2


def test_with_a_range_per_row_an_outlier_input_is_rotated_and_errs_less() -> None:
    """Chosen by the per-row simulation (``--int8-kernel rows``), x (one block of 32 channels, channel 3 60x the
    others) is rotated by the block Hadamard: the float model computes what it did, the rotation's product is
    never quantized, and the per-row int8 file errs less on held-out inputs than with smoothing alone."""
    if int8_kernel_saturates():
        pytest.skip(SATURATES)
    model = outlier_model()
    calibration, held_out = feeds(6), feeds(7)
    rotated, smoothing = smooth_activations(model, calibration, _run, quantized=row_quantized, rotate=True)[:2]
    onnx.checker.check_model(rotated, full_check=True)
    assert smoothing.rotated == 1 and "1 rotated by a block Hadamard of 32 channels" in smoothing.note()
    assert [n.op_type for n in rotated.graph.node if n.name in smoothing.beside] == ["MatMul"]
    reference = _run(model, held_out)
    for got, want in zip(_run(rotated, held_out), reference, strict=True):
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    quantized = _quantize(rotated, list(smoothing.beside), "rows")
    kept = [n for n in quantized.graph.node if n.name in smoothing.beside]
    assert [n.op_type for n in kept] == ["MatMul"]  # the Hadamard block: a float constant product
    smoothed = smooth_activations(model, calibration, _run)[0]
    only_z = [{"z": r["z"]} for r in reference]  # x·W2: the product of the rotated input alone
    alone = relative_error(_quantize(smoothed, [], "rows"), only_z, held_out)
    turned = relative_error(quantized, only_z, held_out)
    print(f"per-row int8 relative error of x·W2 on held-out inputs: smoothed {alone:.3e}, rotated {turned:.3e}")
    assert turned < 0.5 * alone
