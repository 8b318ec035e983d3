"""benchmarks/int8_kernels.py: each int8 product timed beside float32 in onnxruntime, its error bounded against an
exact product, the weight shapes read from a file as onnxruntime folds it, and the advice given only where the
measured times call for it."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _benchmark():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("int8_kernels_benchmark", REPO / "benchmarks" / "int8_kernels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_each_kernel_is_timed_and_its_error_bounded() -> None:
    """float32 is exact to rounding; every int8 form errs like int8 (a step of 1/127 of the range, not 0, not 10%)."""
    bench = _benchmark()
    rows = bench.measure(Counter({(64, 96): 2, (96, 64): 1}), tokens=8, runs=10)
    assert [(row["shape"], row["count"]) for row in rows] == [((64, 96), 2), ((96, 64), 1)]
    for row in rows:
        assert all(row[kernel] > 0 for kernel in bench.KERNELS)
        assert row["float32 error"] < 1e-5
        for kernel in ("rows", "matmulinteger", "blocks"):
            assert 1e-4 < row[f"{kernel} error"] < 0.03, (kernel, row)
    lines = bench.table(rows, tokens=8)
    total = next(line for line in lines if line.strip().startswith("all weights"))
    want = sum(row["float32"] * row["count"] for row in rows)
    assert f"{want:.1f}" in total


def test_shapes_are_read_after_constant_folding(tmp_path: Path) -> None:
    """MatMul [K, N], Gemm with transB ([N, K] stored) and a kernel behind a Reshape of a constant (as tf2onnx
    writes attention outputs) all count; a product of two activations does not."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"]),
        helper.make_node("Gemm", ["a2d", "w2"], ["b"], transB=1),
        helper.make_node("Reshape", ["flat", "shape"], ["w3"]),
        helper.make_node("MatMul", ["b", "w3"], ["c"]),
        helper.make_node("MatMul", ["c", "ct"], ["y"]),
    ]
    initializers = [
        numpy_helper.from_array(rng.normal(size=(8, 16)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(size=(16, 8)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(size=(128,)).astype(np.float32), "flat"),
        numpy_helper.from_array(np.array([16, 8], np.int64), "shape"),
    ]
    graph = helper.make_graph(
        nodes,
        "shapes",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
            helper.make_tensor_value_info("a2d", TensorProto.FLOAT, [2, 8]),
            helper.make_tensor_value_info("ct", TensorProto.FLOAT, [8, 3]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 16]),
        ],
        initializers,
    )
    path = tmp_path / "shapes.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert _benchmark().weight_shapes(path) == Counter({(8, 16): 2, (16, 8): 1})


def test_the_advice_follows_the_measured_times() -> None:
    """The note to prefer matmulinteger appears where blocks took at least NBITS_SLOWER of float32's time, and
    only there (as at 4 tokens on this host, where MatMulNBits' vector path beat float32)."""
    bench = _benchmark()

    def rows(blocks: float) -> list[dict]:
        return [{"shape": (4, 4), "count": 3, "float32": 10.0, "rows": 3.5, "matmulinteger": 3.0, "blocks": blocks}]

    def advice(blocks: float) -> list[str]:
        filled = [{**row, **{f"{k} error": 0.0 for k in bench.KERNELS}} for row in rows(blocks)]
        return [line for line in bench.table(filled, tokens=4) if line.startswith("note:")]

    assert len(advice(10.0 * bench.NBITS_SLOWER)) == 1
    assert "MatMulNBits ran at 1.10x float32's time" in advice(11.0)[0]
    assert advice(10.0 * bench.NBITS_SLOWER - 0.01) == []
