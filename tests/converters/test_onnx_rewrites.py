"""Shape of a constant → a constant: the weight copies tf2onnx keeps only for their shape go."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pe_export.api import export_onnx
from pe_export.converters.onnx.rewrites import drop_unread_initializers, fold_shapes_of_initializers, gemms_to_matmuls
from pe_export.converters.options import ExportOptions
from pe_export.errors import ExitCode
from tests.helpers import onnx_model


def small_graph() -> onnx.ModelProto:
    """y = x @ W; dims = Shape(V)[1:] (V read for nothing else); z = Reshape(U, Shape(U))."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), "W")
    shape_only = numpy_helper.from_array(rng.normal(size=(2, 3, 4)).astype(np.float32), "V")
    also_read = numpy_helper.from_array(rng.normal(size=(6,)).astype(np.float32), "U")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["y"]),
        helper.make_node("Shape", ["V"], ["dims"], start=1),
        helper.make_node("Shape", ["U"], ["u_shape"]),
        helper.make_node("Reshape", ["U", "u_shape"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [
            helper.make_tensor_value_info(name, kind, shape)
            for name, kind, shape in (
                ("y", TensorProto.FLOAT, [None, 4]),
                ("dims", TensorProto.INT64, [2]),
                ("z", TensorProto.FLOAT, [6]),
            )
        ],
        initializer=[weight, shape_only, also_read],
    )
    return onnx_model(graph)


def run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_folds_shapes_and_drops_only_what_nothing_else_reads() -> None:
    model = small_graph()
    x = np.ones((3, 4), np.float32)
    before = run(model, x)
    folding = fold_shapes_of_initializers(model)
    onnx.checker.check_model(model, full_check=True)
    assert (folding.shapes_folded, folding.initializers_dropped, folding.bytes_dropped) == (2, 1, 2 * 3 * 4 * 4)
    assert sorted(init.name for init in model.graph.initializer) == ["U", "W"]
    assert [node.op_type for node in model.graph.node] == ["MatMul", "Constant", "Constant", "Reshape"]
    after = run(model, x)
    assert after[1].tolist() == [3, 4]  # Shape(start=1) of a [2, 3, 4] constant
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def test_exported_encoder_keeps_no_weight_for_its_shape_alone(saved_model, tmp_path: Path) -> None:
    report = export_onnx(saved_model("encoder_dynamic"), tmp_path / "m.onnx", ExportOptions())
    assert report.exit_code == ExitCode.OK and report.parity is not None and report.parity.passed
    assert len(report.notes) == 2 and "kept only for their shape dropped" in report.notes[0]
    assert "LayerNormalization" in report.notes[1]  # the other clean-up: pe_export/converters/onnx/fusions.py
    model = onnx.load(str(tmp_path / "m.onnx"))
    initializers = {init.name for init in model.graph.initializer}
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    assert not [name for name in initializers if readers.get(name) == {"Shape"}]


def gemm_graph() -> onnx.ModelProto:
    """y = Gemm(x, W, C, transB=1); z = Gemm(x, V) without a bias; w = Gemm(x, W, C, beta=0.5) (left alone)."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)
        for name, shape in (("W", (6, 4)), ("C", (6,)), ("V", (4, 5)))
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "W", "C"], ["y"], name="with_bias", transB=1),
        helper.make_node("Gemm", ["x", "V"], ["z"], name="no_bias"),
        helper.make_node("Gemm", ["x", "W", "C"], ["w"], name="scaled_bias", transB=1, beta=0.5),
    ]
    outputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, n]) for name, n in (("y", 6), ("z", 5), ("w", 6))
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])], outputs, initializer=inits
    )
    return onnx_model(graph)


def test_gemm_by_a_constant_becomes_matmul_with_the_same_arithmetic() -> None:
    model = gemm_graph()
    x = np.random.default_rng(4).normal(size=(3, 4)).astype(np.float32)
    before = run(model, x)
    assert gemms_to_matmuls(model) == 2
    onnx.checker.check_model(model, full_check=True)
    ops = [(node.op_type, node.name) for node in model.graph.node]
    assert ops == [
        ("MatMul", "with_bias__matmul"),
        ("Add", "with_bias__bias"),
        ("MatMul", "no_bias__matmul"),
        ("Gemm", "scaled_bias"),
    ]
    for got, want in zip(run(model, x), before, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _high_water_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def test_dropping_an_initializer_does_not_copy_the_kept_weights() -> None:
    """A 256 MB weight read by a MatMul and a small constant nothing reads: the constant goes and the weight stays
    where it is (clearing the field and extending it again copied every kept weight: BERT-base's export peaked
    0.7 GB higher)."""
    weight = numpy_helper.from_array(np.ones((8192, 8192), np.float32), "W")
    unread = numpy_helper.from_array(np.ones(4, np.float32), "unread")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8192])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8192])],
        initializer=[weight, unread],
    )
    del weight
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
        clear.write("5")  # the high-water mark restarts from what is resident now
    before = _high_water_bytes()
    drop_unread_initializers(graph)
    assert [init.name for init in graph.initializer] == ["W"]
    assert _high_water_bytes() - before < 64 * 2**20
