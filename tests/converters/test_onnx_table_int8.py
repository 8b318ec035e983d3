"""Embedding tables in int8 with a step per row: each looked-up row within half its own step, where
onnxruntime's quantize_dynamic gives the whole table the step of its largest value."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pe_export.converters.onnx.quantize import _run
from pe_export.converters.onnx.table_int8 import rowwise_int8_tables, table_lookups
from tests.helpers import onnx_model


def lookup_model(table: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], name="lookup", axis=0)],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None, None])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [None, None, table.shape[1]])],
        initializer=[numpy_helper.from_array(table, "table")],
    )
    return onnx_model(graph)


def test_each_row_keeps_its_own_step() -> None:
    rng = np.random.default_rng(11)
    # rows of magnitudes from 0.01 to 10, as a trained vocabulary's rare and frequent tokens differ
    table = (rng.normal(size=(64, 16)) * np.logspace(-2, 1, 64)[:, None]).astype(np.float32)
    ids = np.arange(64, dtype=np.int64).reshape(4, 16)
    model = lookup_model(table)
    assert table_lookups(model) == ["lookup"]
    assert rowwise_int8_tables(model, ["lookup"]) == 1
    onnx.checker.check_model(model, full_check=True)
    stored = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert "table" not in stored and {v.dtype for v in stored.values()} == {np.dtype(np.int8), np.dtype(np.float32)}
    assert model.graph.node[-1].output[0] == "rows"
    (got,) = _run(model, [{"ids": ids}])
    error = np.abs(got["rows"].reshape(64, 16) - table).max(axis=1)
    half_step = np.abs(table).max(axis=1) / 127 / 2
    assert np.all(error <= half_step * (1 + 1e-5)), (error / half_step).max()
    # onnxruntime's own table quantization: one step for all rows, the small rows lost in it
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as work:
        source, target = Path(work) / "f.onnx", Path(work) / "q.onnx"
        onnx.save(lookup_model(table), str(source))
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, op_types_to_quantize=["Gather"])
        (theirs,) = _run(onnx.load(str(target)), [{"ids": ids}])
    relative = [
        np.abs(g["rows"].reshape(64, 16) - table).max(axis=1) / np.abs(table).max(axis=1) for g in (got, theirs)
    ]
    print(f"worst row relative error: per row {relative[0].max():.2e}, onnxruntime's per table {relative[1].max():.2e}")
    assert relative[0].max() < 0.01 < relative[1].max()


def test_lookups_of_other_axes_or_inputs_are_not_tables() -> None:
    table = np.ones((4, 3), np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "i"], ["a"], name="columns", axis=1),
            helper.make_node("Gather", ["x", "i"], ["b"], name="activation", axis=0),
        ],
        "g",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b")],
        initializer=[numpy_helper.from_array(table, "table")],
    )
    assert table_lookups(onnx_model(graph)) == []
